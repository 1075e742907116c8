// Where a lone client's matrices are computed on a fleet of S > 1 (the policy behind
// StepFleet::PickLoneRank): each matrix to the member of the current generation with the least
// of this rank's estimated cost outstanding on it (ties to this rank, then the lowest rank), so
// that a lone client's matrices spread over the fleet as they arrive. Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/logic/step_fleet.h"

namespace orthoserve {

class LonePlacement {
 public:
  explicit LonePlacement(int self) : self_(self) {}

  // The target of a matrix of estimated `cost` among `members` (the formed generation this rank
  // is a member of; empty: this rank alone). Members without a fleet port are not picked. The
  // cost counts on the target until the returned pointer is released (it may outlive this).
  std::shared_ptr<const LoneTarget> Pick(const std::vector<Member>& members, double cost);

  // Lone matrices this rank has kept and sent to peers since it started.
  int64_t here() const { return load_->here.load(); }
  int64_t forwarded() const { return load_->forwarded.load(); }

 private:
  // Shared with the targets handed out.
  struct Load {
    absl::Mutex mu;
    std::map<int, double> outstanding ABSL_GUARDED_BY(mu);  // By rank.
    std::atomic<int64_t> here{0};
    std::atomic<int64_t> forwarded{0};
  };

  const int self_;
  const std::shared_ptr<Load> load_ = std::make_shared<Load>();
};

}  // namespace orthoserve
