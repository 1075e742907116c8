// Implementation of server/engine/cpu/working_matrix.h.
#include "server/engine/cpu/working_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "server/engine/cpu/bf16_round.h"

namespace orthoserve {
namespace {

constexpr int64_t kTile = 16;

// dst (cols × rows) = srcᵀ for src rows × cols, in 16×16 tiles through a local buffer so that
// reads and writes both use whole cache lines.
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  float tile[kTile][kTile];
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) tile[j - j0][i - i0] = src[i * cols + j];
      }
      for (int64_t j = j0; j < j1; ++j) {
        std::memcpy(dst + j * rows + i0, tile[j - j0], static_cast<size_t>(i1 - i0) * sizeof(float));
      }
    }
  }
}

void Scale(const float* __restrict src, int64_t count, double scale, float* __restrict dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(static_cast<double>(src[i]) * scale);
}

}  // namespace

void LoadWorking(DType dtype, const void* in, int64_t rows, int64_t cols, bool transpose, float* scratch, float* x) {
  const size_t count = static_cast<size_t>(rows * cols);
  if (!transpose) {
    ConvertToF32(dtype, in, count, x);
    return;
  }
  const float* src = static_cast<const float*>(in);
  if (dtype != DType::kF32) {
    ConvertToF32(dtype, in, count, scratch);
    src = scratch;
  } else if (reinterpret_cast<uintptr_t>(in) % alignof(float) != 0) {
    std::memcpy(scratch, in, count * sizeof(float));
    src = scratch;
  }
  Transpose(src, rows, cols, x);
}

void StoreWorking(const float* x, int64_t rows, int64_t cols, bool transpose, double scale, float* scratch, DType dtype,
                  void* out) {
  const int64_t count = rows * cols;
  const float* oriented = x;
  if (transpose) {
    Transpose(x, cols, rows, scratch);
    oriented = scratch;
  }
  const bool direct = dtype == DType::kF32 && reinterpret_cast<uintptr_t>(out) % alignof(float) == 0;
  float* scaled = direct ? static_cast<float*>(out) : scratch;
  Scale(oriented, count, scale, scaled);
  if (!direct) ConvertFromF32(dtype, scaled, static_cast<size_t>(count), out);
}

double SumOfSquares(const float* x, int64_t count) {
  // Four partial sums keep the loop from being one long dependency chain; the order is fixed.
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (; i < count; ++i) s[0] += static_cast<double>(x[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float NormDivisor(double sum_squares, double eps, EpsMode mode) {
  const double norm = std::sqrt(sum_squares);
  return static_cast<float>(mode == EpsMode::kMax ? std::max(norm, eps) : norm + eps);
}

void NormalizeInPlace(float* x, int64_t count, float divisor, bool round_bf16) {
  if (divisor != 0.0f) {
    for (int64_t i = 0; i < count; ++i) x[i] = x[i] / divisor;
  }
  if (round_bf16) {
    RoundToBf16InPlace(x, count);
  }
}

}  // namespace orthoserve
