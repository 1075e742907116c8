// Implementation of assembled.h.
#include "server/distributed/assembled.h"

#include "server/engine/newton_schulz.h"

namespace orthoserve::distributed_internal {

Assembled MakeAssembled(const BatchContext& ctx, int m) {
  const MatrixPlan& mp = ctx.matrix(m);
  const Block whole = WholeBlock(mp.view);
  return Assembled{m, std::vector<char>(InBytes(mp, whole), 0), std::vector<char>(OutBytes(mp, whole), 0)};
}

const LocalBlock* WholeLocalBlock(const BatchContext& ctx, int m) {
  if (!ctx.Ok(m)) return nullptr;
  const MatrixPlan& mp = ctx.matrix(m);
  for (const BlockPlacement& p : mp.blocks) {
    if (p.fleet_rank == ctx.rank() && p.block == WholeBlock(mp.view)) return ctx.Local(m, p.trainer_rank);
  }
  return nullptr;
}

void PutBlock(const MatrixPlan& m, const Block& block, const char* src, Assembled& a) {
  if (block.empty()) return;
  CopyBlockIn(src, block, ElementSize(m.dtype), a.in.data(), m.view.cols);
}

void GetBlock(const MatrixPlan& m, const Block& block, const Assembled& a, char* dst) {
  if (block.empty()) return;
  CopyBlockOut(a.out.data(), m.view.cols, block, ElementSize(m.result_dtype), dst);
}

void OrthogonalizeAssembled(BatchContext& ctx, std::vector<Assembled>& matrices) {
  std::vector<MatrixJob> jobs;
  std::vector<int> job_matrix;
  double flops = 0;
  for (Assembled& a : matrices) {
    if (!ctx.Ok(a.matrix)) continue;
    const MatrixPlan& mp = ctx.matrix(a.matrix);
    const void* in = a.direct_in != nullptr ? a.direct_in : a.in.data();
    void* out = a.direct_out != nullptr ? a.direct_out : a.out.data();
    jobs.push_back(
        MatrixJob{mp.name, mp.view, mp.view, mp.dtype, in, mp.result_dtype, out, &mp.options, BatchRowsOf(mp)});
    job_matrix.push_back(a.matrix);
    flops += EngineFlops(mp.view, mp.options, BatchRowsOf(mp));
  }
  if (jobs.empty()) return;
  std::vector<absl::Status> results = ctx.Compute(flops, [&] { return Orthogonalize(ctx.backend(), jobs); });
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!results[j].ok()) ctx.Fail(job_matrix[j], results[j], FailureKind::kPrimary);
  }
}

}  // namespace orthoserve::distributed_internal
