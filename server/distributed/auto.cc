// AUTO (docs/architecture.md): every block to its matrix's owner, NS once there, the results back.
#include <vector>

#include "server/distributed/algorithms.h"
#include "server/distributed/exchange.h"

namespace orthoserve::distributed_internal {

absl::Status RunAuto(BatchContext& ctx) {
  std::vector<OwnedMatrix> set;
  for (int m = 0; m < static_cast<int>(ctx.plan().matrices.size()); ++m) {
    if (ctx.Valid(m) && ctx.matrix(m).algorithm == Algorithm::kAuto) set.push_back(OwnedMatrix{m, ctx.matrix(m).owner});
  }
  if (set.empty()) return absl::OkStatus();
  return AssembleOnOwners(ctx, set, "auto");
}

}  // namespace orthoserve::distributed_internal
