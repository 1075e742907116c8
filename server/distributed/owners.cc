// AssignOwners (batch.h): AUTO matrices to fleet ranks by estimated NS cost, largest first, each
// to the least-loaded rank — the longest-processing-time rule, deterministic for a given plan.
#include <algorithm>
#include <vector>

#include "server/distributed/batch.h"

namespace orthoserve {

void AssignOwners(BatchPlan& plan) {
  std::vector<double> cost(plan.matrices.size(), 0);
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    if (plan.matrices[i].algorithm == Algorithm::kAuto) cost[i] = EstimatedCost(plan.matrices[i]);
  }
  AssignOwners(plan, cost);
}

void AssignOwners(BatchPlan& plan, absl::Span<const double> cost) {
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    MatrixPlan& m = plan.matrices[i];
    m.owner = -1;
    if (m.algorithm != Algorithm::kAuto) continue;
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  const int world = std::max(plan.fleet_world, 1);
  std::vector<double> load(world, 0);
  for (size_t i : order) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    plan.matrices[i].owner = rank;
    load[rank] += cost[i];
  }
}

}  // namespace orthoserve
