// Implementation of exchange.h: packing blocks per destination rank, the two all-to-allv calls,
// assembling on the owner and unpacking the results.
#include "server/distributed/exchange.h"

#include <vector>

#include "common/status.h"
#include "server/distributed/assembled.h"

namespace orthoserve::distributed_internal {
namespace {

// Bytes of the blocks of the set's matrices owned by `owner` and placed on `holder`, in the
// input (in = true) or result dtype. An owner's own blocks never travel (0 bytes to itself).
size_t SegmentBytes(const BatchContext& ctx, absl::Span<const OwnedMatrix> set, int owner, int holder, bool in) {
  if (owner == holder) return 0;
  size_t bytes = 0;
  for (const OwnedMatrix& om : set) {
    if (om.owner != owner) continue;
    const MatrixPlan& mp = ctx.matrix(om.matrix);
    for (int t : ctx.TrainersOn(om.matrix, holder)) {
      bytes += in ? InBytes(mp, mp.blocks[t].block) : OutBytes(mp, mp.blocks[t].block);
    }
  }
  return bytes;
}

// Which blocks an all-to-allv of AssembleOnOwners carries between this rank and each peer p:
// kToOwners, this rank's blocks of the matrices p owns (sent as inputs, received back as
// results); kFromHolders, p's blocks of the matrices this rank owns (received as inputs, sent
// back as results).
enum class Side { kToOwners, kFromHolders };

// Calls visit(om, mp, t) for every block of `side`, in the order the all-to-allv lays them out:
// peer-major (this rank skipped), then set order, then trainer rank. Packing and unpacking walk
// the same order, so each side's send and receive agree.
template <typename Visit>
void ForEachExchanged(const BatchContext& ctx, absl::Span<const OwnedMatrix> set, Side side, Visit visit) {
  const int me = ctx.rank();
  for (int p = 0; p < ctx.world(); ++p) {
    if (p == me) continue;
    const int owner = side == Side::kToOwners ? p : me;
    const int holder = side == Side::kToOwners ? me : p;
    for (const OwnedMatrix& om : set) {
      if (om.owner != owner) continue;
      const MatrixPlan& mp = ctx.matrix(om.matrix);
      for (int t : ctx.TrainersOn(om.matrix, holder)) visit(om, mp, t);
    }
  }
}

size_t Total(const std::vector<size_t>& sizes) {
  size_t total = 0;
  for (size_t s : sizes) total += s;
  return total;
}

}  // namespace

absl::Status AssembleOnOwners(BatchContext& ctx, absl::Span<const OwnedMatrix> set, const std::string& phase) {
  const int me = ctx.rank();
  const int world = ctx.world();
  std::vector<size_t> send_in(world), recv_in(world), send_out(world), recv_out(world);
  for (int p = 0; p < world; ++p) {
    send_in[p] = SegmentBytes(ctx, set, p, me, true);    // My blocks, to owner p.
    recv_in[p] = SegmentBytes(ctx, set, me, p, true);    // p's blocks of what I own.
    send_out[p] = SegmentBytes(ctx, set, me, p, false);  // Results of what I own, to p.
    recv_out[p] = SegmentBytes(ctx, set, p, me, false);  // Results of my blocks, from p.
  }

  // Pack: destination-major, then set order, then trainer rank.
  ASSIGN_OR_RETURN(MemoryBuffer send, ctx.Allocate(Total(send_in), false, phase + " blocks to send"));
  char* cursor = send.data();
  ForEachExchanged(ctx, set, Side::kToOwners, [&](const OwnedMatrix& om, const MatrixPlan& mp, int t) {
    ctx.ReadBlock(om.matrix, t, cursor);
    cursor += InBytes(mp, mp.blocks[t].block);
  });
  ASSIGN_OR_RETURN(MemoryBuffer recv, ctx.Allocate(Total(recv_in), false, phase + " blocks received"));
  RETURN_IF_ERROR(ctx.Collect(phase + " all-to-allv of the blocks", [&] {
    return ctx.collective().AllToAllv(send.data(), send_in, recv.data(), recv_in, ctx.timeout());
  }));
  send.Reset();

  // Assemble what this rank owns: its own blocks straight from the caller's buffers (or no
  // assembly at all when one local block is the whole matrix and blocks stay in host memory),
  // then the received ones, source-major, set order, trainer rank.
  std::vector<Assembled> owned;
  std::vector<int> slot(ctx.plan().matrices.size(), -1);
  for (const OwnedMatrix& om : set) {
    if (om.owner != me) continue;
    slot[om.matrix] = static_cast<int>(owned.size());
    if (const LocalBlock* whole = WholeLocalBlock(ctx, om.matrix)) {
      Assembled direct;
      direct.matrix = om.matrix;
      direct.direct_in = whole->in;
      direct.direct_out = whole->out;
      owned.push_back(std::move(direct));
      continue;
    }
    ASSIGN_OR_RETURN(Assembled a, MakeAssembled(ctx, om.matrix));
    owned.push_back(std::move(a));
    if (!ctx.Ok(om.matrix)) continue;
    const MatrixPlan& mp = ctx.matrix(om.matrix);
    for (int t : ctx.TrainersOn(om.matrix, me)) ctx.ReadBlock(om.matrix, t, owned.back().in.data(), mp.view.cols);
  }
  const char* in_cursor = recv.data();
  ForEachExchanged(ctx, set, Side::kFromHolders, [&](const OwnedMatrix& om, const MatrixPlan& mp, int t) {
    Assembled& a = owned[slot[om.matrix]];
    if (a.direct_in == nullptr) PutBlock(ctx, mp.blocks[t].block, in_cursor, a);
    in_cursor += InBytes(mp, mp.blocks[t].block);
  });
  recv.Reset();
  OrthogonalizeAssembled(ctx, owned);

  // Results: this rank's own blocks straight into the caller's buffers, the others back in the
  // mirror of the packing above, in the result dtype.
  for (const OwnedMatrix& om : set) {
    if (om.owner != me) continue;
    const Assembled& a = owned[slot[om.matrix]];
    if (a.direct_in != nullptr) continue;
    const MatrixPlan& mp = ctx.matrix(om.matrix);
    for (int t : ctx.TrainersOn(om.matrix, me)) ctx.WriteBlock(om.matrix, t, a.out.data(), mp.view.cols);
  }
  ASSIGN_OR_RETURN(MemoryBuffer back, ctx.Allocate(Total(send_out), false, phase + " results to send"));
  char* out_cursor = back.data();
  ForEachExchanged(ctx, set, Side::kFromHolders, [&](const OwnedMatrix& om, const MatrixPlan& mp, int t) {
    // A direct matrix has no blocks elsewhere: its other placements are empty.
    GetBlock(ctx, mp.blocks[t].block, owned[slot[om.matrix]], out_cursor);
    out_cursor += OutBytes(mp, mp.blocks[t].block);
  });
  owned.clear();
  ASSIGN_OR_RETURN(MemoryBuffer results, ctx.Allocate(Total(recv_out), false, phase + " results received"));
  RETURN_IF_ERROR(ctx.Collect(phase + " all-to-allv of the results", [&] {
    return ctx.collective().AllToAllv(back.data(), send_out, results.data(), recv_out, ctx.timeout());
  }));
  const char* result_cursor = results.data();
  ForEachExchanged(ctx, set, Side::kToOwners, [&](const OwnedMatrix& om, const MatrixPlan& mp, int t) {
    ctx.WriteBlock(om.matrix, t, result_cursor);
    result_cursor += OutBytes(mp, mp.blocks[t].block);
  });
  return absl::OkStatus();
}

}  // namespace orthoserve::distributed_internal
