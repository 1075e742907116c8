// Implementation of assembled.h.
#include "server/distributed/assembled.h"

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve::distributed_internal {

absl::StatusOr<Assembled> MakeAssembled(BatchContext& ctx, int m) {
  const MatrixPlan& mp = ctx.matrix(m);
  const Block whole = WholeBlock(mp.view);
  const std::string what = absl::StrCat("matrix \"", BoundedText(mp.name), "\" assembled");
  Assembled a;
  a.matrix = m;
  ASSIGN_OR_RETURN(a.in, ctx.Allocate(InBytes(mp, whole), true, what));
  ASSIGN_OR_RETURN(a.out, ctx.Allocate(OutBytes(mp, whole), true, what));
  return a;
}

const LocalBlock* WholeLocalBlock(BatchContext& ctx, int m) {
  if (!ctx.Ok(m)) return nullptr;
  const MatrixPlan& mp = ctx.matrix(m);
  for (const BlockPlacement& p : mp.blocks) {
    if (p.fleet_rank != ctx.rank() || !(p.block == WholeBlock(mp.view))) continue;
    const LocalBlock* lb = ctx.Local(m, p.trainer_rank);
    // Computed on the caller's buffers only where the batch computes: host blocks of a host batch,
    // device blocks (a CUDA IPC region) of a device batch.
    return lb != nullptr && lb->space == ctx.memory().space() ? lb : nullptr;
  }
  return nullptr;
}

void PutBlock(BatchContext& ctx, const Block& block, const char* src, Assembled& a) {
  ctx.MoveBlock(a.matrix, block, src, a.in.data(), /*into=*/true);
}

void GetBlock(BatchContext& ctx, const Block& block, const Assembled& a, char* dst) {
  ctx.MoveBlock(a.matrix, block, a.out.data(), dst, /*into=*/false);
}

void OrthogonalizeAssembled(BatchContext& ctx, std::vector<Assembled>& matrices) {
  std::vector<MatrixJob> jobs;
  std::vector<int> job_matrix;
  double flops = 0;
  for (Assembled& a : matrices) {
    if (!ctx.Ok(a.matrix)) continue;
    const MatrixPlan& mp = ctx.matrix(a.matrix);
    // Direct (caller's) buffers are in the batch's memory too (WholeLocalBlock).
    jobs.push_back(MatrixJob{mp.name, mp.view, mp.view, mp.dtype, a.input(), mp.result_dtype, a.output(), &mp.options,
                             BatchRowsOf(mp), ctx.memory().space()});
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
