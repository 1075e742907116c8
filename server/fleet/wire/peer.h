// Peer compute between the members of a fleet (fleet.proto's Peer service): the rank that
// receives a lone client's matrix may have another member compute it, so that a lone client's
// matrices spread over the fleet as soon as each has arrived (docs/architecture.md). The member
// computes it in its own compute queue, under the client's tenant and job, exactly as it would
// compute it for a client of its own (RunLocalBatch), and sends the result back.
//
// What a forwarded matrix holds on the computing member (its input and result) is admitted on
// the rank that received it, which holds the same bytes until the result is back.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fair_pool.h"
#include "orthoserve/fleet/v1/fleet.grpc.pb.h"
#include "server/plan/matrix_plan.h"
#include "server/engine/backend.h"
#include "server/fleet/wire/fleet_access.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/fleet/logic/fleet_log.h"
#include "server/fleet/logic/step_fleet.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

// The Peer service of a member. Thread-safe; no thread is held while a matrix waits or computes.
// With fleet TLS (`access` enforcing) it computes only for callers whose certificate names a
// fleet member (PERMISSION_DENIED otherwise, before anything is queued).
class PeerService final : public fleet::v1::Peer::CallbackService {
 public:
  // None owned; all outlive the service. `metrics` may be null; `access` null lets every call through.
  PeerService(Backend* backend, FairPool* compute, Metrics* metrics, const FleetAccess* access = nullptr)
      : backend_(backend), compute_(compute), metrics_(metrics), access_(access) {}

  grpc::ServerUnaryReactor* Compute(grpc::CallbackServerContext* context, const fleet::v1::ComputeRequest* request,
                                    fleet::v1::ComputeResponse* response) override;

 private:
  Backend* backend_;
  FairPool* compute_;
  Metrics* metrics_;
  const FleetAccess* access_;
};

// Calls peers' Peer services (one channel per peer address and rank, kept). Thread-safe.
class PeerClient {
 public:
  // Each call gives up after `deadline` (DEADLINE_EXCEEDED). `tls` (not owned, outlives the
  // client) makes every channel mutual TLS (MakeFleetChannel); null: plaintext.
  explicit PeerClient(absl::Duration deadline, const FleetTls* tls = nullptr) : deadline_(deadline), tls_(tls) {}

  // Has fleet rank `rank`, the member at `target` (HOST:PORT of its fleet address), compute
  // `matrix`; `done` gets its result, or the call's failure (UNAVAILABLE when the member is gone
  // or, with fleet TLS, its certificate does not carry rank `rank`'s member name), on a gRPC thread.
  // `matrix.data` is copied before this returns. The request carries the plan and the data, not
  // the block: the member computes the whole matrix, and fails the call with INVALID_ARGUMENT
  // when `matrix.block` is not all of it (the data's size does not match).
  // While fleet rank `rank` is gone (see Generation), `done` gets UNAVAILABLE at once; with
  // fleet TLS, a rank outside the fleet (it has no member name) gets INVALID_ARGUMENT at once.
  void Compute(const std::string& target, int rank, const PeerMatrix& matrix,
               std::function<void(absl::StatusOr<PeerResult>)> done);

  // The fleet's next generation has `members` (as this rank reads it from the log). When the
  // change was not graceful (a rank lost, restarted or its group broken), every call in flight
  // to a rank that is not among the members is cancelled now (its `done` gets CANCELLED, and the
  // forwarding step computes the matrix itself instead of waiting for the call's deadline, which
  // is the collective timeout), and later calls to that rank fail at once until a generation
  // lists it again. A graceful change cancels nothing: a leaving rank finishes what it took.
  void Generation(const std::vector<Member>& members, bool graceful);

  // Calls in flight (for tests and metrics).
  size_t in_flight() const;

 private:
  struct Call;
  // The calls in flight and the ranks that are gone, shared with every call's completion (which
  // may run after the client is destroyed).
  struct Flights {
    absl::Mutex mu;
    // Calls in flight by rank, each until its completion runs.
    absl::flat_hash_map<int, absl::flat_hash_set<std::shared_ptr<Call>>> calls ABSL_GUARDED_BY(mu);
    absl::flat_hash_set<int> members ABSL_GUARDED_BY(mu);  // Ranks of the last generation seen.
    absl::flat_hash_set<int> gone ABSL_GUARDED_BY(mu);     // Ranks a non-graceful generation left out.
  };
  // The stub for fleet rank `rank` at `target`; MakeFleetChannel's error for a rank without a
  // member name.
  absl::StatusOr<fleet::v1::Peer::Stub*> StubFor(const std::string& target, int rank) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration deadline_;
  const FleetTls* const tls_;
  absl::Mutex mu_;
  // By "RANK@HOST:PORT". A stub, once made, is never removed or replaced: StubFor's pointer
  // to it outlives the lock.
  absl::flat_hash_map<std::string, std::unique_ptr<fleet::v1::Peer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Flights> flights_ = std::make_shared<Flights>();
};

}  // namespace orthoserve
