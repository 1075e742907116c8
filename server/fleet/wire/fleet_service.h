// The orthoserve.fleet.v1.Fleet gRPC service that fleet rank 0 serves to the other ranks: its
// Store and its Coordinator, carried over the wire. A thin adapter; thread-safe. With fleet TLS
// (`access` enforcing) only members call it, each only as itself (server/fleet/wire/fleet_access.h):
// Join, Leave, ReadLog, Report and Abort need the caller's certificate to name the rank they
// speak for, the store calls one that names some member; others get PERMISSION_DENIED.
#pragma once

#include <cstddef>

#include "orthoserve/fleet/v1/fleet.grpc.pb.h"
#include "server/collective/store.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/wire/fleet_access.h"

namespace orthoserve {

class FleetService final : public fleet::v1::Fleet::Service {
 public:
  // A ReadLog response carries the entries from `from` up to this size (always at least one);
  // the reader reads the rest with its next call. A quarter of the fleet channel's 256 MiB
  // message limit: one batch entry of W = 1024 trainer ranks × 560 matrices is ~10 MB
  // (bench/results/plan_scale.md), so a reader that fell behind by a few dozen of them would
  // otherwise get a response over the limit with every retry.
  static constexpr size_t kMaxReadBytes = 64 << 20;

  // None is owned; all must outlive the service. `access` null: every call is let through (a
  // plaintext fleet port).
  FleetService(Store* store, Coordinator* coordinator, size_t max_read_bytes = kMaxReadBytes,
               const FleetAccess* access = nullptr)
      : store_(store), coordinator_(coordinator), max_read_bytes_(max_read_bytes), access_(access) {}

  grpc::Status Join(grpc::ServerContext* context, const fleet::v1::JoinRequest* request,
                    fleet::v1::JoinResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const fleet::v1::LeaveRequest* request,
                     fleet::v1::LeaveResponse* response) override;
  grpc::Status StoreSet(grpc::ServerContext* context, const fleet::v1::StoreSetRequest* request,
                        fleet::v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const fleet::v1::StoreGetRequest* request,
                        fleet::v1::StoreGetResponse* response) override;
  grpc::Status StoreAdd(grpc::ServerContext* context, const fleet::v1::StoreAddRequest* request,
                        fleet::v1::StoreAddResponse* response) override;
  grpc::Status Report(grpc::ServerContext* context, const fleet::v1::ReadyReport* request,
                      fleet::v1::ReportResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const fleet::v1::AbortRequest* request,
                     fleet::v1::AbortResponse* response) override;
  grpc::Status ReadLog(grpc::ServerContext* context, const fleet::v1::ReadLogRequest* request,
                       fleet::v1::ReadLogResponse* response) override;

 private:
  // OK, or the refusal of `access_` (PERMISSION_DENIED).
  absl::Status RequireRank(const grpc::ServerContext* context, absl::string_view call, int rank) const;
  absl::Status RequireMember(const grpc::ServerContext* context, absl::string_view call) const;

  Store* store_;
  Coordinator* coordinator_;
  const size_t max_read_bytes_;
  const FleetAccess* access_;
};

}  // namespace orthoserve
