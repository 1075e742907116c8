// ROW_SHARDED (docs/architecture.md): the seed's orthogonalize_exact — matrices grouped by dtype, ordered by
// numel descending, processed in rounds of world() with fleet rank i owning the i-th matrix of a
// round. The row layout itself was checked by ValidatePlan.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/distributed/algorithms.h"
#include "server/distributed/exchange.h"

namespace orthoserve::distributed_internal {

absl::Status RunRowSharded(BatchContext& ctx) {
  // Dtype groups in order of first appearance, as the seed's dict of row-sharded groups.
  std::vector<DType> dtypes;
  std::vector<std::vector<int>> groups;
  for (int m = 0; m < static_cast<int>(ctx.plan().matrices.size()); ++m) {
    if (!ctx.Valid(m) || ctx.matrix(m).algorithm != Algorithm::kRowSharded) continue;
    const DType dtype = ctx.matrix(m).dtype;
    auto it = std::find(dtypes.begin(), dtypes.end(), dtype);
    if (it == dtypes.end()) {
      dtypes.push_back(dtype);
      groups.emplace_back();
      it = dtypes.end() - 1;
    }
    groups[it - dtypes.begin()].push_back(m);
  }
  const int world = ctx.world();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int>& order = groups[g];
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return ctx.matrix(a).view.numel() > ctx.matrix(b).view.numel(); });
    for (size_t start = 0; start < order.size(); start += world) {
      std::vector<OwnedMatrix> round;
      for (size_t i = start; i < order.size() && i < start + world; ++i) {
        round.push_back(OwnedMatrix{order[i], static_cast<int>(i - start)});
      }
      RETURN_IF_ERROR(
          AssembleOnOwners(ctx, round, absl::StrCat("row_sharded ", DTypeName(dtypes[g]), " round ", start / world)));
    }
  }
  return absl::OkStatus();
}

}  // namespace orthoserve::distributed_internal
