// TP_BLOCKWISE (docs/architecture.md, MindSpeed's tp_mode "blockwise"): each trainer rank's block is
// orthogonalized alone and scaled by its own shape. Local to the rank that holds the block.
#include <vector>

#include "server/distributed/algorithms.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve::distributed_internal {

void RunTpBlockwise(BatchContext& ctx) {
  std::vector<MatrixJob> jobs;
  std::vector<int> job_matrix;
  double flops = 0;
  for (int m = 0; m < static_cast<int>(ctx.plan().matrices.size()); ++m) {
    const MatrixPlan& mp = ctx.matrix(m);
    if (!ctx.Valid(m) || !ctx.Ok(m) || mp.algorithm != Algorithm::kTpBlockwise) continue;
    for (int t : ctx.TrainersOn(m, ctx.rank())) {
      const Block& b = mp.blocks[t].block;
      const LocalBlock* lb = ctx.Local(m, t);
      if (b.empty() || lb == nullptr) continue;
      const Matrix2d shape{b.rows, b.cols};
      jobs.push_back(
          MatrixJob{mp.name, shape, shape, mp.dtype, lb->in, mp.result_dtype, lb->out, &mp.options, 0, lb->space});
      job_matrix.push_back(m);
      flops += EngineFlops(shape, mp.options);
    }
  }
  if (jobs.empty()) return;
  std::vector<absl::Status> results = ctx.Compute(flops, [&] { return Orthogonalize(ctx.backend(), jobs); });
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!results[j].ok()) ctx.Fail(job_matrix[j], results[j], FailureKind::kPrimary);
  }
}

}  // namespace orthoserve::distributed_internal
