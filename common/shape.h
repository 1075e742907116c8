// Shapes, blocks and the block math shared by the service and the algorithms.
//
// Every parameter is handled as a 2-D matrix: an N-d shape [d0, d1, ..., dk] is viewed as
// d0 × (d1·…·dk), row-major. A Block is a rectangle of that 2-D view. Pure functions,
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace orthoserve {

struct Matrix2d {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return rows * cols; }
  bool operator==(const Matrix2d& o) const { return rows == o.rows && cols == o.cols; }
};

// How an N-d tensor is read as matrices (the wire's NdLayout). For 2 dims both are the same.
//  - kFlatten: one matrix shape[0] × prod(shape[1:]) (Muon's convention for conv filters);
//  - kBatch: prod(shape[:-2]) matrices of shape[-2] × shape[-1] (Emerging-Optimizers' batched
//    newton_schulz), stacked by rows into the 2-D view prod(shape[:-1]) × shape[-1].
enum class NdLayout { kFlatten, kBatch };

absl::string_view NdLayoutName(NdLayout layout);  // "flatten", "batch"
// INVALID_ARGUMENT listing the accepted names.
absl::Status ParseNdLayout(absl::string_view text, NdLayout* layout);

// The 2-D view of `shape` (at least 2 dims, each > 0) under `layout`. INVALID_ARGUMENT when a
// dim is zero or negative, when there are fewer than 2 dims, or when the element count
// overflows int64; `what` names the field in the message (for example "matrix \"w1\" shape").
absl::StatusOr<Matrix2d> ViewAs2d(absl::Span<const int64_t> shape, const std::string& what,
                                  NdLayout layout = NdLayout::kFlatten);

// Rows of each matrix when the 2-D view of a valid `shape` under `layout` stacks more than one
// matrix (shape[-2] for kBatch with prod(shape[:-2]) > 1); 0 when the view is a single matrix.
int64_t BatchRows(absl::Span<const int64_t> shape, NdLayout layout);

// "4, 5, 6" for messages; a list longer than `shown` keeps its first `shown` values and says how
// many more there are ("1, 1, ... (and 9984 more)"): gRPC carries messages in metadata, whose
// size is limited.
std::string ListText(absl::Span<const int64_t> values, size_t shown = 16);

// A rectangle [row_offset, row_offset + rows) × [col_offset, col_offset + cols) of a matrix.
// Empty blocks (rows or cols == 0) are allowed: a rank may hold nothing of a matrix.
struct Block {
  int64_t row_offset = 0;
  int64_t col_offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return rows * cols; }
  bool empty() const { return rows == 0 || cols == 0; }
  bool operator==(const Block& o) const {
    return row_offset == o.row_offset && col_offset == o.col_offset && rows == o.rows && cols == o.cols;
  }
};

// The whole matrix as one block.
inline Block WholeBlock(Matrix2d m) { return Block{0, 0, m.rows, m.cols}; }

std::string BlockString(const Block& block);

// INVALID_ARGUMENT unless `block` has non-negative extents and lies inside `matrix`.
absl::Status CheckBlockInside(const Block& block, Matrix2d matrix, const std::string& what);

// INVALID_ARGUMENT unless the non-empty `blocks` cover `matrix` exactly once (no overlap, no gap).
// The message names the two overlapping blocks (by index) or a cell left uncovered.
absl::Status CheckTiling(Matrix2d matrix, absl::Span<const Block> blocks, const std::string& what);

// torch.chunk sizes of `n` items over `world` parts: ceil(n / world) each, the last parts
// shorter or empty. Sums to n. Requires world >= 1.
std::vector<int64_t> ChunkSizes(int64_t n, int world);

// Start offsets of ChunkSizes(n, world); entry `world` is n.
std::vector<int64_t> ChunkOffsets(int64_t n, int world);

// Part `part` of torch.chunk over `world` parts of `matrix` along its rows (dim 0) or its columns
// (dim 1), as ChunkSizes and ChunkOffsets cut it: an empty part starts at the end of that dim.
// Requires world >= 1, 0 <= part < world, dim 0 or 1.
Block ChunkBlock(Matrix2d matrix, int world, int part, int dim);

// The fleet rank that trainer rank `trainer_rank` of a W-rank group streams to, in a fleet of
// `fleet_world` ranks: floor(r · S / W).
inline int FleetRankOfTrainer(int trainer_rank, int trainer_world, int fleet_world) {
  return static_cast<int>(static_cast<int64_t>(trainer_rank) * fleet_world / trainer_world);
}

// Copies `block` out of a row-major matrix with `ld` elements per row into the dense
// block-sized buffer `dst`, elements of `elem_size` bytes.
void CopyBlockOut(const void* matrix, int64_t ld, const Block& block, size_t elem_size, void* dst);

// Copies the dense block buffer `src` into `block` of a row-major matrix with `ld` per row.
void CopyBlockIn(const void* src, const Block& block, size_t elem_size, void* matrix, int64_t ld);

}  // namespace orthoserve
