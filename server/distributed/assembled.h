// Internal to server/distributed: whole matrices assembled on one rank from their blocks, and
// the one engine call that orthogonalizes them (AUTO, ROW_SHARDED, GATHERED, TP_DUPLICATED).
#pragma once

#include <vector>

#include "server/distributed/batch_context.h"

namespace orthoserve::distributed_internal {

// A whole matrix, in buffers of its own or (direct) in the caller's buffers of a local block
// that covers the whole matrix.
struct Assembled {
  int matrix = 0;
  std::vector<char> in;             // view.rows × view.cols elements of the matrix dtype, row-major.
  std::vector<char> out;            // The same in the result dtype.
  const void* direct_in = nullptr;  // When set, NS reads here and writes `direct_out` instead.
  void* direct_out = nullptr;
};

// Allocates the buffers of an assembled matrix `m` (input zeroed).
Assembled MakeAssembled(const BatchContext& ctx, int m);

// The local block of matrix `m` on this rank when it is the whole matrix and usable here (so
// NS can run on the caller's buffers with no copy), or nullptr.
const LocalBlock* WholeLocalBlock(const BatchContext& ctx, int m);

// Copies a block's bytes into / out of an assembled matrix.
void PutBlock(const MatrixPlan& m, const Block& block, const char* src, Assembled& a);
void GetBlock(const MatrixPlan& m, const Block& block, const Assembled& a, char* dst);

// Orthogonalizes every assembled matrix that has not failed on this rank, in one engine call
// (the same function as engine Orthogonalize of the whole matrix, hence bit-identical to it).
// A matrix whose NS fails is marked failed (primary) in `ctx`.
void OrthogonalizeAssembled(BatchContext& ctx, std::vector<Assembled>& matrices);

}  // namespace orthoserve::distributed_internal
