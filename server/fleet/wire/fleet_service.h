// The orthoserve.fleet.v1.Fleet gRPC service that the fleet's coordinator serves to the other
// ranks (rank 0 of a static fleet; the elected rank with etcd): its Store and its Coordinator,
// carried over the wire. Every call is answered by the seat in place when it arrives; a rank
// that holds none (not elected, or between terms) answers UNAVAILABLE, which members take as
// "look for the coordinator again". A thin adapter on gRPC's callback API: no
// call holds a server thread while it waits. A ReadLog long poll waits in the coordinator
// (Coordinator::ReadAsync) and a StoreGet in the store (InMemoryStore::GetAsync), each on one
// notifier thread for all waiting calls; responses of ReadLog, which may be large, are encoded
// on a small pool. Thread-safe. With fleet TLS (`access` enforcing) only members call it, each
// only as itself (server/fleet/wire/fleet_access.h): Join, Leave, ReadLog, Report and Abort need
// the caller's certificate to name the rank they speak for, the store calls one that names some
// member; others get PERMISSION_DENIED.
#pragma once

#include <cstddef>
#include <functional>

#include "common/fair_pool.h"
#include "orthoserve/fleet/v1/fleet.grpc.pb.h"
#include "server/collective/in_memory_store.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/wire/encoded_log.h"
#include "server/fleet/wire/fleet_access.h"
#include "server/fleet/wire/spec_list_cache.h"

namespace orthoserve {

// What the fleet service serves: a coordinator and its rendezvous store. A static fleet's rank 0
// has one seat for the process's life; an elected coordinator one per leadership term.
struct CoordinatorSeat {
  std::shared_ptr<Coordinator> coordinator;  // Required.
  std::shared_ptr<InMemoryStore> store;      // Null: the store calls fail with UNAVAILABLE.
};
// The seat in place now; null when this rank does not coordinate. A call keeps the seat it took
// until it is answered, so the source's owner must keep every seat it handed out alive as long
// as the service (a waiting call's callback may otherwise hold the last reference, on the
// coordinator's own thread).
using SeatSource = std::function<std::shared_ptr<const CoordinatorSeat>()>;

// The calls of the Fleet service without a transport: FleetService answers each gRPC call with
// them, and tests call them directly. Each runs `done` exactly once, within the call or later
// (ReadLog, StoreGet: when the wait ends); `response` must live until then.
class FleetCalls {
 public:
  using Done = std::function<void(grpc::Status)>;

  // A ReadLog response carries the entries from `from` up to this size (always at least one);
  // the reader reads the rest with its next call. A quarter of the fleet channel's 256 MiB
  // message limit: one batch entry of W = 1024 trainer ranks × 560 matrices is ~10 MB
  // (bench/results/plan_scale.md), so a reader that fell behind by a few dozen of them would
  // otherwise get a response over the limit with every retry.
  static constexpr size_t kMaxReadBytes = 64 << 20;

  // `access` (not owned) null: every call is let through (a plaintext fleet port).
  FleetCalls(SeatSource seats, size_t max_read_bytes = kMaxReadBytes, const FleetAccess* access = nullptr);
  // One fixed seat. None is owned; all must outlive this. `store` null: the store calls fail
  // with UNAVAILABLE.
  FleetCalls(InMemoryStore* store, Coordinator* coordinator, size_t max_read_bytes = kMaxReadBytes,
             const FleetAccess* access = nullptr);

  grpc::Status Join(const grpc::ServerContextBase& context, const fleet::v1::JoinRequest& request,
                    fleet::v1::JoinResponse* response);
  grpc::Status Leave(const grpc::ServerContextBase& context, const fleet::v1::LeaveRequest& request);
  grpc::Status StoreSet(const grpc::ServerContextBase& context, const fleet::v1::StoreSetRequest& request);
  void StoreGet(const grpc::ServerContextBase& context, const fleet::v1::StoreGetRequest& request,
                fleet::v1::StoreGetResponse* response, Done done);
  grpc::Status StoreAdd(const grpc::ServerContextBase& context, const fleet::v1::StoreAddRequest& request,
                        fleet::v1::StoreAddResponse* response);
  grpc::Status Report(const grpc::ServerContextBase& context, const fleet::v1::ReadyReport& request);
  grpc::Status Abort(const grpc::ServerContextBase& context, const fleet::v1::AbortRequest& request);
  void ReadLog(const grpc::ServerContextBase& context, const fleet::v1::ReadLogRequest& request,
               fleet::v1::ReadLogResponse* response, Done done);

 private:
  // OK, or the refusal of `access_` (PERMISSION_DENIED).
  absl::Status RequireRank(const grpc::ServerContextBase& context, absl::string_view call, int rank) const;
  absl::Status RequireMember(const grpc::ServerContextBase& context, absl::string_view call) const;
  // The seat in place, or UNAVAILABLE (this rank does not coordinate now).
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> Seat() const;
  // The seat's store, or UNAVAILABLE.
  static absl::Status RequireStore(const CoordinatorSeat& seat);
  // Fills `response` with `entries`' encodings up to max_read_bytes_ (at least one).
  void Encode(const std::vector<SharedLogEntry>& entries, fleet::v1::ReadLogResponse* response);

  const SeatSource seats_;
  const size_t max_read_bytes_;
  const FleetAccess* access_;
  EncodedLog encoded_;        // Each entry encoded once, for all its readers.
  SpecListCache spec_lists_;  // Reports' and kept notices' spec lists, decoded once per distinct list.
  FairPool encoder_;          // Encodes ReadLog responses off the coordinator's notifier thread.
};

class FleetService final : public fleet::v1::Fleet::CallbackService {
 public:
  static constexpr size_t kMaxReadBytes = FleetCalls::kMaxReadBytes;

  // As FleetCalls.
  FleetService(SeatSource seats, size_t max_read_bytes = kMaxReadBytes, const FleetAccess* access = nullptr)
      : calls_(std::move(seats), max_read_bytes, access) {}
  FleetService(InMemoryStore* store, Coordinator* coordinator, size_t max_read_bytes = kMaxReadBytes,
               const FleetAccess* access = nullptr)
      : calls_(store, coordinator, max_read_bytes, access) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context, const fleet::v1::JoinRequest* request,
                                 fleet::v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context, const fleet::v1::LeaveRequest* request,
                                  fleet::v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context, const fleet::v1::StoreSetRequest* request,
                                     fleet::v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context, const fleet::v1::StoreGetRequest* request,
                                     fleet::v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context, const fleet::v1::StoreAddRequest* request,
                                     fleet::v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context, const fleet::v1::ReadyReport* request,
                                   fleet::v1::ReportResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context, const fleet::v1::AbortRequest* request,
                                  fleet::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* ReadLog(grpc::CallbackServerContext* context, const fleet::v1::ReadLogRequest* request,
                                    fleet::v1::ReadLogResponse* response) override;

 private:
  FleetCalls calls_;
};

}  // namespace orthoserve
