// NS with no steps, which is elementwise (normalize, round, scale), on the CPU backend's threads.
#pragma once

#include "absl/status/status.h"
#include "server/engine/backend.h"
#include "server/engine/cpu/parallel_for.h"

namespace orthoserve {

// Writes task.out = scale · normalize(task.in) for a task whose schedule is empty, reading `in`
// twice (the sum of squares, then the normalize-round-scale-store pass) with no working matrix.
// Both passes are split over `pool`'s threads when the matrix is large enough to gain from it:
// the sum of squares by its blocks (whose sums are then added in SumOfSquaresOf's order) and the
// store by disjoint slices, so the bits are those of one thread for any pool size. `task` has
// been checked (host buffers, positive shape, non-null args); `in` and `out` either do not
// overlap or are the same bytes in the same dtype size (else the store runs on one thread, in
// order). INVALID_ARGUMENT, with nothing written, when the input holds a NaN or Inf
// (CheckSumOfSquares).
absl::Status RunElementwiseNs(ParallelFor& pool, const NsTask& task);

}  // namespace orthoserve
