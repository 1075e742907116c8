// Implementation of server/engine/cpu/blas_products.h.
#include "server/engine/cpu/blas_products.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "server/engine/cpu/bf16_round.h"

namespace orthoserve {
namespace {

constexpr int64_t kMirrorTile = 16;

// Boundaries of `parts` row blocks of an m×m lower triangle holding about equal areas:
// r_p = m·√(p / parts).
int64_t TriangleBoundary(int64_t m, int64_t p, int64_t parts) {
  if (p >= parts) return m;
  return static_cast<int64_t>(std::llround(static_cast<double>(m) * std::sqrt(static_cast<double>(p) / parts)));
}

// Column boundaries of `parts` equal slices of n columns, multiples of 16 floats where possible.
int64_t ColumnBoundary(int64_t n, int64_t p, int64_t parts) {
  if (p >= parts) return n;
  const int64_t j = n * p / parts;
  return std::min(n, (j + 8) / 16 * 16);
}

int64_t Parts(const ParallelFor& pool, int64_t extent) {
  return std::max<int64_t>(1, std::min<int64_t>(pool.threads(), extent));
}

// Runs fn(r0, r1) for row blocks of the lower triangle of an m×m matrix.
template <typename Fn>
void ForTriangleBlocks(ParallelFor& pool, int64_t m, const Fn& fn) {
  const int64_t parts = Parts(pool, m);
  if (parts == 1) {
    fn(0, m);
    return;
  }
  pool.Run(parts, [&](int64_t p) {
    const int64_t r0 = TriangleBoundary(m, p, parts);
    const int64_t r1 = TriangleBoundary(m, p + 1, parts);
    if (r1 > r0) fn(r0, r1);
  });
}

// Lower triangle rows [r0, r1) of C = alpha·X·Xᵀ (X m×k).
void SyrkRows(int64_t m, int64_t k, float alpha, const float* x, float* c, int64_t r0, int64_t r1) {
  const int rows = static_cast<int>(r1 - r0);
  cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, rows, static_cast<int>(k), alpha, x + r0 * k,
              static_cast<int>(k), 0.0f, c + r0 * m + r0, static_cast<int>(m));
  if (r0 > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, static_cast<int>(r0), static_cast<int>(k), alpha,
                x + r0 * k, static_cast<int>(k), x, static_cast<int>(k), 0.0f, c + r0 * m, static_cast<int>(m));
  }
}

}  // namespace

void SyrkLower(ParallelFor& pool, int64_t m, int64_t k, float alpha, const float* x, float* c, bool round_bf16) {
  ForTriangleBlocks(pool, m, [&](int64_t r0, int64_t r1) {
    SyrkRows(m, k, alpha, x, c, r0, r1);
    if (!round_bf16) return;
    for (int64_t i = r0; i < r1; ++i) RoundToBf16InPlace(c + i * m, i + 1);
  });
}

void SymmetricPolyLower(ParallelFor& pool, int64_t m, float alpha, float beta, const float* s, float* c,
                        bool round_bf16) {
  ForTriangleBlocks(pool, m, [&](int64_t r0, int64_t r1) {
    SyrkRows(m, m, alpha, s, c, r0, r1);
    for (int64_t i = r0; i < r1; ++i) {
      float* __restrict row = c + i * m;
      const float* __restrict srow = s + i * m;
      for (int64_t j = 0; j <= i; ++j) row[j] = row[j] + beta * srow[j];
      if (round_bf16) RoundToBf16InPlace(row, i + 1);
    }
  });
}

void MirrorLower(int64_t m, float* c) {
  // 16×16 tiles through a local buffer: both the strided reads and the writes then touch whole
  // cache lines, and a power-of-two m does not make the rows of a tile collide in one L1 set.
  constexpr int64_t kT = kMirrorTile;
  float tile[kT][kT];
  for (int64_t i0 = 0; i0 < m; i0 += kT) {
    const int64_t i1 = std::min(m, i0 + kT);
    for (int64_t j0 = 0; j0 < i0; j0 += kT) {  // Tiles strictly below the diagonal.
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = 0; j < kT; ++j) tile[j][i - i0] = c[i * m + j0 + j];
      }
      for (int64_t j = 0; j < kT; ++j) {
        std::memcpy(c + (j0 + j) * m + i0, tile[j], static_cast<size_t>(i1 - i0) * sizeof(float));
      }
    }
    for (int64_t i = i0; i < i1; ++i) {  // The diagonal tile.
      for (int64_t j = i0; j < i; ++j) c[j * m + i] = c[i * m + j];
    }
  }
}

void GemmAddmm(ParallelFor& pool, int64_t m, int64_t n, float alpha, const float* b, const float* x, float beta,
               float* y, bool round_bf16) {
  const int64_t parts = Parts(pool, (n + 15) / 16);
  auto slice = [&](int64_t p) {
    const int64_t j0 = ColumnBoundary(n, p, parts);
    const int64_t j1 = ColumnBoundary(n, p + 1, parts);
    if (j1 <= j0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(j1 - j0),
                static_cast<int>(m), alpha, b, static_cast<int>(m), x + j0, static_cast<int>(n), 0.0f, y + j0,
                static_cast<int>(n));
    for (int64_t i = 0; i < m; ++i) {
      float* __restrict yrow = y + i * n;
      const float* __restrict xrow = x + i * n;
      for (int64_t j = j0; j < j1; ++j) yrow[j] = yrow[j] + beta * xrow[j];
      if (round_bf16) RoundToBf16InPlace(yrow + j0, j1 - j0);
    }
  };
  if (parts == 1) {
    slice(0);
  } else {
    pool.Run(parts, slice);
  }
}

}  // namespace orthoserve
