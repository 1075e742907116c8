// The Newton–Schulz iteration of docs/numerics.md §2 steps 2–3 on fp32 working matrices: normalization
// and the schedule's steps, for one matrix or for the local shards of a sharded matrix whose
// Gram and norm are summed over participants by a SumReducer.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/backend.h"
#include "server/engine/cpu/parallel_for.h"

namespace orthoserve {

// One working matrix X_s (gram × n, row-major) and a buffer of the same size for the update.
struct WorkingShard {
  int64_t n = 0;
  std::vector<float> x;
  std::vector<float> y;
};

// Normalizes the shards by the Frobenius norm of their concatenation [X_1 … X_k] (summed over
// participants when `reducer` is set), then runs every step of args.schedule on them with a
// Gram of side `gram`; the result is left in each shard's `x`. With no reducer the shards are
// the whole matrix (Run uses exactly one). With a reducer the call makes 1 + steps reductions
// (the sum of squares, then each step's Gram of gram² floats) even when `shards` is empty.
// Returns the reducer's error, INVALID_ARGUMENT when the (reduced) sum of squares is not finite
// (CheckSumOfSquares: every participant then stops after the first reduction, before changing
// its shards), or RESOURCE_EXHAUSTED when the Gram buffers cannot be allocated.
absl::Status RunNsLoop(ParallelFor& pool, const NsKernelArgs& args, int64_t gram, std::vector<WorkingShard>& shards,
                       SumReducer* reducer);

// OK when `sum_squares`, the double sum of the squares of a matrix's fp32 elements, is finite;
// else INVALID_ARGUMENT: an element is NaN or Inf. A finite element's square is exact in double
// and below 2^256, so fewer than 2^53 of them cannot add up to Inf: the sum is finite exactly
// when every element is.
absl::Status CheckSumOfSquares(double sum_squares);

}  // namespace orthoserve
