// Implementation of common/shape.h.
#include "common/shape.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoserve {

std::string ListText(absl::Span<const int64_t> values, size_t shown) {
  if (values.size() <= shown) return absl::StrJoin(values, ", ");
  return absl::StrCat(absl::StrJoin(values.subspan(0, shown), ", "), ", ... (and ", values.size() - shown, " more)");
}

absl::string_view NdLayoutName(NdLayout layout) { return layout == NdLayout::kBatch ? "batch" : "flatten"; }

absl::Status ParseNdLayout(absl::string_view text, NdLayout* layout) {
  if (text == "flatten") {
    *layout = NdLayout::kFlatten;
  } else if (text == "batch") {
    *layout = NdLayout::kBatch;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown N-d layout \"", text, "\"; expected flatten or batch"));
  }
  return absl::OkStatus();
}

int64_t BatchRows(absl::Span<const int64_t> shape, NdLayout layout) {
  if (layout != NdLayout::kBatch || shape.size() < 3) return 0;
  int64_t matrices = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) matrices *= shape[i];
  return matrices > 1 ? shape[shape.size() - 2] : 0;
}

absl::StatusOr<Matrix2d> ViewAs2d(absl::Span<const int64_t> shape, const std::string& what, NdLayout layout) {
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " [", ListText(shape), "] has ", shape.size(),
        " dims; orthogonalization needs at least 2 (a 1-D parameter is not a matrix)"));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t cols = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " [", ListText(shape), "] has dim ", i, " = ",
                                                     shape[i], "; every dim must be positive"));
    }
    if (i > 0) {
      if (cols > kMax / shape[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " [", ListText(shape), "] has more elements than fit in int64"));
      }
      cols *= shape[i];
    }
  }
  if (shape[0] > kMax / cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " [", ListText(shape), "] has more elements than fit in int64"));
  }
  if (layout == NdLayout::kBatch) {
    const int64_t last = shape[shape.size() - 1];
    return Matrix2d{shape[0] * cols / last, last};
  }
  return Matrix2d{shape[0], cols};
}

std::string BlockString(const Block& b) {
  return absl::StrCat("rows [", b.row_offset, ", ", b.row_offset + b.rows, ") x cols [", b.col_offset, ", ",
                      b.col_offset + b.cols, ")");
}

absl::Status CheckBlockInside(const Block& b, Matrix2d m, const std::string& what) {
  if (b.row_offset < 0 || b.col_offset < 0 || b.rows < 0 || b.cols < 0 || b.row_offset > m.rows - b.rows ||
      b.col_offset > m.cols - b.cols) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", BlockString(b), " does not lie inside the ", m.rows,
                                                   "x", m.cols, " matrix"));
  }
  return absl::OkStatus();
}

absl::Status CheckTiling(Matrix2d m, absl::Span<const Block> blocks, const std::string& what) {
  // Sort the non-empty blocks by (row, col) and sweep: with every block inside the matrix and
  // total area equal to the matrix, pairwise disjointness implies exact cover.
  std::vector<size_t> order;
  int64_t area = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    absl::Status inside = CheckBlockInside(blocks[i], m, absl::StrCat(what, " block ", i));
    if (!inside.ok()) return inside;
    if (!blocks[i].empty()) {
      order.push_back(i);
      area += blocks[i].numel();
    }
  }
  // Pairwise overlap check: the number of blocks per matrix is the group size (small).
  for (size_t x = 0; x < order.size(); ++x) {
    for (size_t y = x + 1; y < order.size(); ++y) {
      const Block& a = blocks[order[x]];
      const Block& b = blocks[order[y]];
      bool rows_overlap = a.row_offset < b.row_offset + b.rows && b.row_offset < a.row_offset + a.rows;
      bool cols_overlap = a.col_offset < b.col_offset + b.cols && b.col_offset < a.col_offset + a.cols;
      if (rows_overlap && cols_overlap) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": block ", order[x], " (", BlockString(a),
                                                       ") overlaps block ", order[y], " (", BlockString(b), ")"));
      }
    }
  }
  if (area != m.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the blocks cover ", area, " of the ", m.numel(),
                                                   " elements of the ", m.rows, "x", m.cols,
                                                   " matrix; they must tile it with no gap"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> ChunkSizes(int64_t n, int world) {
  std::vector<int64_t> sizes(world, 0);
  int64_t chunk = (n + world - 1) / world;
  int64_t left = n;
  for (int i = 0; i < world; ++i) {
    sizes[i] = std::min(chunk, left);
    left -= sizes[i];
  }
  return sizes;
}

std::vector<int64_t> ChunkOffsets(int64_t n, int world) {
  std::vector<int64_t> sizes = ChunkSizes(n, world);
  std::vector<int64_t> offsets(world + 1, 0);
  for (int i = 0; i < world; ++i) offsets[i + 1] = offsets[i] + sizes[i];
  return offsets;
}

Block ChunkBlock(Matrix2d matrix, int world, int part, int dim) {
  const int64_t n = dim == 0 ? matrix.rows : matrix.cols;
  const int64_t chunk = (n + world - 1) / world;
  const int64_t offset = std::min(chunk * part, n);
  const int64_t size = std::min(chunk, n - offset);
  return dim == 0 ? Block{offset, 0, size, matrix.cols} : Block{0, offset, matrix.rows, size};
}

void CopyBlockOut(const void* matrix, int64_t ld, const Block& b, size_t elem_size, void* dst) {
  const char* src = static_cast<const char*>(matrix);
  char* out = static_cast<char*>(dst);
  const size_t row_bytes = static_cast<size_t>(b.cols) * elem_size;
  for (int64_t r = 0; r < b.rows; ++r) {
    std::memcpy(out + r * row_bytes, src + ((b.row_offset + r) * ld + b.col_offset) * elem_size, row_bytes);
  }
}

void CopyBlockIn(const void* src, const Block& b, size_t elem_size, void* matrix, int64_t ld) {
  const char* in = static_cast<const char*>(src);
  char* dst = static_cast<char*>(matrix);
  const size_t row_bytes = static_cast<size_t>(b.cols) * elem_size;
  for (int64_t r = 0; r < b.rows; ++r) {
    std::memcpy(dst + ((b.row_offset + r) * ld + b.col_offset) * elem_size, in + r * row_bytes, row_bytes);
  }
}

}  // namespace orthoserve
