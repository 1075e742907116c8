// TP_DISTRIBUTED (docs/architecture.md, Emerging-Optimizers' newton_schulz_tp "distributed"): the engine's
// sharded NS over the whole fleet, each trainer shard one NsShard (so that in MEDIUM each
// trainer shard's Gram is rounded to bf16 before the sum, as the trainers do). Fleet ranks with
// no shards join every reduction with zeros.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"
#include "server/distributed/algorithms.h"
#include "server/distributed/guarded_reducer.h"
#include "server/engine/newton_schulz.h"

namespace orthoserve::distributed_internal {
namespace {

absl::Status RunOne(BatchContext& ctx, int m) {
  const MatrixPlan& mp = ctx.matrix(m);
  const std::string what = absl::StrCat("matrix \"", BoundedText(mp.name), "\"");
  GuardedReducer reducer(ctx, what);
  absl::Status status = ctx.status(m);
  if (status.ok()) {
    std::vector<NsShard> shards;
    NsOptions forced = mp.options;
    forced.transpose = mp.partition_dim == 0 ? TransposeMode::kOn : TransposeMode::kOff;
    double flops = 0;
    for (int t : ctx.TrainersOn(m, ctx.rank())) {
      const Block& b = mp.blocks[t].block;
      const LocalBlock* lb = ctx.Local(m, t);
      if (b.empty() || lb == nullptr) continue;
      shards.push_back(NsShard{Matrix2d{b.rows, b.cols}, mp.dtype, lb->in, mp.result_dtype, lb->out, lb->space});
      flops += EngineFlops(Matrix2d{b.rows, b.cols}, forced);
    }
    status = ctx.Compute(flops, [&] {
      return OrthogonalizeSharded(ctx.backend(), mp.name, mp.view, mp.partition_dim, mp.options, shards, reducer);
    });
  }
  RETURN_IF_ERROR(reducer.collective_error());
  bool any_failed = false;
  RETURN_IF_ERROR(reducer.Finish(!status.ok(), &any_failed));
  if (!status.ok()) {
    ctx.Fail(m, status, reducer.stopped_by_peer() ? FailureKind::kSecondary : FailureKind::kPrimary);
  } else if (any_failed) {
    ctx.Fail(m, absl::AbortedError(absl::StrCat(what, ": another fleet rank failed its part of the tp_distributed NS")),
             FailureKind::kSecondary);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTpDistributed(BatchContext& ctx) {
  for (int m = 0; m < static_cast<int>(ctx.plan().matrices.size()); ++m) {
    if (ctx.Valid(m) && ctx.matrix(m).algorithm == Algorithm::kTpDistributed) RETURN_IF_ERROR(RunOne(ctx, m));
  }
  return absl::OkStatus();
}

}  // namespace orthoserve::distributed_internal
