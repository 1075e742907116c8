// Internal to server/distributed: whole matrices assembled on one rank from their blocks, and
// the one engine call that orthogonalizes them (AUTO, ROW_SHARDED, GATHERED, TP_DUPLICATED).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/distributed/batch_context.h"

namespace orthoserve::distributed_internal {

// A whole matrix, in buffers of the batch's memory (BatchContext::memory()) or (direct) in the
// caller's buffers of a local block that covers the whole matrix and lies in that memory too.
struct Assembled {
  int matrix = 0;
  MemoryBuffer in;                  // view.rows × view.cols elements of the matrix dtype, row-major.
  MemoryBuffer out;                 // The same in the result dtype.
  const void* direct_in = nullptr;  // When set, NS reads here (the batch's memory) and writes `direct_out`.
  void* direct_out = nullptr;

  const void* input() const { return direct_in != nullptr ? direct_in : in.data(); }
  void* output() const { return direct_out != nullptr ? direct_out : out.data(); }
};

// Allocates the zeroed buffers of an assembled matrix `m` in the batch's memory; the
// error is BatchContext::Allocate's (the batch fails). Zeroed because a matrix that fails here
// is not computed, yet its `out` is still packed and exchanged with the other ranks' results
// (exchange.cc): it must carry zeros, not bytes an earlier batch left in the memory.
absl::StatusOr<Assembled> MakeAssembled(BatchContext& ctx, int m);

// The local block of matrix `m` on this rank when it is the whole matrix and usable here, and its
// buffers are in the memory the batch keeps blocks in (host blocks of a host batch, device
// blocks of a device batch), so NS can run on the caller's buffers with no copy; or nullptr.
const LocalBlock* WholeLocalBlock(BatchContext& ctx, int m);

// Copies a block's dense bytes (in the batch's memory) into / out of an assembled matrix.
void PutBlock(BatchContext& ctx, const Block& block, const char* src, Assembled& a);
void GetBlock(BatchContext& ctx, const Block& block, const Assembled& a, char* dst);

// Orthogonalizes every assembled matrix that has not failed on this rank, in one engine call
// (the same function as engine Orthogonalize of the whole matrix, hence bit-identical to it).
// A matrix whose NS fails is marked failed (primary) in `ctx`.
void OrthogonalizeAssembled(BatchContext& ctx, std::vector<Assembled>& matrices);

}  // namespace orthoserve::distributed_internal
