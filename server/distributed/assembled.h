// Internal to server/distributed: whole matrices assembled on one rank from their blocks, and
// the one engine call that orthogonalizes them (AUTO, ROW_SHARDED, GATHERED, TP_DUPLICATED).
#pragma once

#include <vector>

#include "server/distributed/batch_context.h"

namespace orthoserve::distributed_internal {

struct Assembled {
  int matrix = 0;
  std::vector<char> in;   // view.rows × view.cols elements of the matrix dtype, row-major.
  std::vector<char> out;  // The same in the result dtype.
};

// Allocates the buffers of an assembled matrix `m` (input zeroed).
Assembled MakeAssembled(const BatchContext& ctx, int m);

// Copies a block's bytes into / out of an assembled matrix.
void PutBlock(const MatrixPlan& m, const Block& block, const char* src, Assembled& a);
void GetBlock(const MatrixPlan& m, const Block& block, const Assembled& a, char* dst);

// Orthogonalizes every assembled matrix that has not failed on this rank, in one engine call
// (the same function as engine Orthogonalize of the whole matrix, hence bit-identical to it).
// A matrix whose NS fails is marked failed (primary) in `ctx`.
void OrthogonalizeAssembled(BatchContext& ctx, std::vector<Assembled>& matrices);

}  // namespace orthoserve::distributed_internal
