// Implementation of server/distributed/local_batch.h.
#include "server/distributed/local_batch.h"

#include "server/collective/local_collective.h"

namespace orthoserve {

absl::StatusOr<BatchResult> RunLocalBatch(std::vector<LocalMatrix> matrices, Backend& backend) {
  BatchPlan plan;
  plan.trainer_world = 1;
  plan.fleet_world = 1;
  std::vector<LocalBlock> local;
  for (size_t i = 0; i < matrices.size(); ++i) {
    LocalMatrix& m = matrices[i];
    m.plan.blocks = {BlockPlacement{0, 0, m.block}};
    plan.matrices.push_back(std::move(m.plan));
    local.push_back(LocalBlock{static_cast<int>(i), 0, m.in, m.out});
  }
  AssignOwners(plan);
  LocalCollective collective;
  return ExecuteBatch(plan, local, backend, collective, ExecuteOptions{});
}

}  // namespace orthoserve
