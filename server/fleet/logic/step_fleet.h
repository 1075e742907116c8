// StepFleet: what the step layer (server/step) needs of the fleet, and nothing else — whether
// this rank serves group steps, its rank, handing a trainer rank's part of a group step to the
// fleet and taking it back, where a lone client's matrix is computed, and having a peer compute
// it. No gRPC: Fleet (server/fleet/wire/fleet.h) implements it over the network, and the step layer's
// tests (tests/unit/step) with a fake, so that a step runs and is tested without a server.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/fleet/logic/group_step.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

// Where a lone client's matrix is computed (StepFleet::PickLoneRank): this rank, or a member's
// fleet address.
struct LoneTarget {
  int rank = 0;
  std::string address;  // The member's fleet HOST:PORT; empty for this rank.
  bool here() const { return address.empty(); }
};

// A lone client's matrix to compute on a peer: the whole matrix (`block` is all of it). On the
// wire, ComputeRequest's MatrixPlan (server/fleet/wire/plan_codec.h) and the data.
struct PeerMatrix {
  std::string tenant;
  std::string job;
  MatrixPlan plan;  // Without placements.
  Block block;
  absl::string_view data;  // block.numel() elements of plan.dtype; read before ComputeOnPeer returns.
};

// The peer's answer: the matrix's status and, when OK, its result in plan.result_dtype.
struct PeerResult {
  absl::Status status;
  std::string data;
  absl::Duration compute_time;
  double flops = 0;
};

// Thread-safe; every method may be called from any thread.
class StepFleet {
 public:
  virtual ~StepFleet() = default;

  // This rank (0 <= rank < world) and the fleet's full size S.
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // This rank is a member of a formed generation: it serves group steps (and lone clients
  // through the fleet). When false it serves lone clients on its own.
  virtual bool ready() const = 0;
  // This rank takes a group step now: ready(), or not yet but Submit holds the step until the
  // fleet's next generation forms here (a re-formation under way). False: refuse the step at once.
  virtual bool takes_group_steps() const { return ready(); }

  // Registers this trainer rank's part of a group step; `done` runs exactly once (possibly
  // before Submit returns, when the fleet cannot take the step), and sets step->submission
  // before it returns (Executor::Submit).
  virtual void Submit(std::shared_ptr<TrainerStep> step, StepCallback done) = 0;
  // Withdraws trainer rank `trainer_rank`'s part of the step `key` (submission 0: one not
  // submitted yet) and tells the other ranks that the step failed with `reason`
  // (Executor::AbortStep).
  virtual void AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission) = 0;

  // Where to compute a lone client's matrix of estimated `cost` (EstimatedCost): this rank, or a
  // member of the generation with less of this rank's cost outstanding. The cost is counted
  // until the returned target is released.
  virtual std::shared_ptr<const LoneTarget> PickLoneRank(double cost) = 0;
  // Has the member `target` (not here()) compute `matrix`; `done` gets the result or the call's
  // failure (UNAVAILABLE: the member is gone; compute it here then), on any thread.
  virtual void ComputeOnPeer(const LoneTarget& target, const PeerMatrix& matrix,
                             std::function<void(absl::StatusOr<PeerResult>)> done) = 0;
};

}  // namespace orthoserve
