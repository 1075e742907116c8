// GATHERED and TP_DUPLICATED (docs/architecture.md): every matrix all-gathered to every fleet rank, NS on
// every rank that holds a block of it, each rank keeps its own blocks. Buffers are in the batch's
// memory (device memory on a GPU rank with NCCL: each block up once, gathered device to device). The seed's fallback for
// layouts other than row shards, and Emerging-Optimizers' "duplicated" tensor-parallel mode.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/distributed/algorithms.h"
#include "server/distributed/assembled.h"

namespace orthoserve::distributed_internal {
namespace {

// Matrices are gathered in groups of at most this many bytes (inputs plus results on one rank),
// in plan order, so that a large batch does not hold every matrix at once; a larger matrix
// forms a group of its own.
constexpr size_t kGatherGroupBytes = size_t{256} << 20;

// One all-gatherv of the matrices of `group`, then NS on all of them, then this rank's blocks.
absl::Status GatherGroup(BatchContext& ctx, const std::vector<int>& group, int index) {
  const int me = ctx.rank();
  const int world = ctx.world();
  std::vector<size_t> recv_bytes(world, 0);
  for (int p = 0; p < world; ++p) {
    for (int m : group) {
      for (int t : ctx.TrainersOn(m, p)) recv_bytes[p] += InBytes(ctx.matrix(m), ctx.matrix(m).blocks[t].block);
    }
  }
  const std::string what = absl::StrCat("gathered group ", index);
  ASSIGN_OR_RETURN(MemoryBuffer send, ctx.Allocate(recv_bytes[me], false, what + " blocks to send"));
  char* cursor = send.data();
  for (int m : group) {
    for (int t : ctx.TrainersOn(m, me)) {
      ctx.ReadBlock(m, t, cursor);
      cursor += InBytes(ctx.matrix(m), ctx.matrix(m).blocks[t].block);
    }
  }
  size_t total = 0;
  for (size_t b : recv_bytes) total += b;
  ASSIGN_OR_RETURN(MemoryBuffer recv, ctx.Allocate(total, false, what + " blocks received"));
  RETURN_IF_ERROR(ctx.Collect(what + " all-gatherv", [&] {
    return ctx.collective().AllGatherv(send.data(), recv_bytes[me], recv.data(), recv_bytes, ctx.timeout());
  }));
  send.Reset();

  // A rank with no non-empty block of a matrix has no use for its result and skips its NS; a
  // rank holding the whole matrix in one local block runs NS on the caller's buffers (when blocks
  // stay in host memory).
  std::vector<Assembled> whole;
  std::vector<int> slot(group.size(), -1);
  whole.reserve(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    const int m = group[i];
    bool needed = false;
    for (int t : ctx.TrainersOn(m, me)) needed = needed || !ctx.matrix(m).blocks[t].block.empty();
    if (!needed) continue;
    slot[i] = static_cast<int>(whole.size());
    if (const LocalBlock* lb = WholeLocalBlock(ctx, m)) {
      Assembled direct;
      direct.matrix = m;
      direct.direct_in = lb->in;
      direct.direct_out = lb->out;
      whole.push_back(std::move(direct));
    } else {
      ASSIGN_OR_RETURN(Assembled a, MakeAssembled(ctx, m));
      whole.push_back(std::move(a));
    }
  }
  const char* in = recv.data();
  for (int p = 0; p < world; ++p) {
    for (size_t i = 0; i < group.size(); ++i) {
      const MatrixPlan& mp = ctx.matrix(group[i]);
      for (int t : ctx.TrainersOn(group[i], p)) {
        if (slot[i] >= 0 && whole[slot[i]].direct_in == nullptr) {
          PutBlock(ctx, mp.blocks[t].block, in, whole[slot[i]]);
        }
        in += InBytes(mp, mp.blocks[t].block);
      }
    }
  }
  recv.Reset();
  OrthogonalizeAssembled(ctx, whole);

  for (size_t i = 0; i < group.size(); ++i) {
    const int m = group[i];
    if (!ctx.Ok(m) || slot[i] < 0 || whole[slot[i]].direct_in != nullptr) continue;
    const MatrixPlan& mp = ctx.matrix(m);
    for (int t : ctx.TrainersOn(m, me)) ctx.WriteBlock(m, t, whole[slot[i]].out.data(), mp.view.cols);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGathered(BatchContext& ctx) {
  std::vector<std::vector<int>> groups;
  size_t group_bytes = 0;
  for (int m = 0; m < static_cast<int>(ctx.plan().matrices.size()); ++m) {
    const Algorithm algorithm = ctx.matrix(m).algorithm;
    if (!ctx.Valid(m) || (algorithm != Algorithm::kGathered && algorithm != Algorithm::kTpDuplicated)) continue;
    const Block whole = WholeBlock(ctx.matrix(m).view);
    const size_t bytes = InBytes(ctx.matrix(m), whole) + OutBytes(ctx.matrix(m), whole);
    if (groups.empty() || group_bytes + bytes > kGatherGroupBytes) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(m);
    group_bytes += bytes;
  }
  for (size_t g = 0; g < groups.size(); ++g) RETURN_IF_ERROR(GatherGroup(ctx, groups[g], static_cast<int>(g)));
  return absl::OkStatus();
}

}  // namespace orthoserve::distributed_internal
