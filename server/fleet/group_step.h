// One trainer rank's part of a group step, as the RPC layer hands it to the fleet, and the
// outcome the fleet hands back. No gRPC here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/distributed/batch.h"

namespace orthoserve {

// Identifies a step of a trainer group: (tenant, job, group name, step number).
struct GroupKey {
  std::string tenant;
  std::string job;
  std::string group;
  int64_t step = 0;

  bool operator==(const GroupKey& o) const {
    return step == o.step && tenant == o.tenant && job == o.job && group == o.group;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GroupKey& k) {
    return H::combine(std::move(h), k.tenant, k.job, k.group, k.step);
  }
  // "tenant/job/group@step" for logs and messages.
  std::string ToString() const;
  // The group this is a step of (step 0).
  GroupKey Group() const { return GroupKey{tenant, job, group, 0}; }
};

// What one trainer rank sent for a step. `matrices[i].blocks` holds exactly one placement:
// this trainer's block (with its fleet rank). `inputs[i]` holds that block's bytes in
// matrices[i].dtype (empty for an empty block or a matrix rejected before its data arrived);
// `outputs[i]` is filled by the fleet with the result block in result_dtype.
struct TrainerStep {
  GroupKey key;
  int trainer_rank = 0;
  int trainer_world = 1;
  int attempt = 0;          // The client's attempt number (StepHeader.attempt).
  uint64_t submission = 0;  // Set by the executor: identifies this submission in reports and the log.
  std::vector<MatrixPlan> matrices;
  std::vector<std::vector<char>> inputs;
  std::vector<std::vector<char>> outputs;
  absl::Time submitted;
};

// The result of a step for one trainer rank. `status` not OK: the whole step failed (ABORTED
// for a rendezvous timeout or another rank's failure, INVALID_ARGUMENT for specs that differ
// between ranks or a bad group, UNAVAILABLE for a fleet failure); otherwise `matrices` holds
// one status per matrix. `retryable`: the failure came from a change of the fleet's membership
// (a retry of the whole step may succeed; UNAVAILABLE always may).
struct StepOutcome {
  absl::Status status;
  bool retryable = false;
  std::vector<absl::Status> matrices;
  absl::Duration rendezvous_time;
  absl::Duration queue_time;
  absl::Duration collective_time;
  absl::Duration compute_time;
};

using StepCallback = std::function<void(StepOutcome)>;

}  // namespace orthoserve
