// The matrix products of Newton–Schulz on cuBLASLt (lt_gemm.h): a plain GEMM with its epilogue,
// and the symmetric product P·Pᵀ that computes only the upper triangle (in row strips, fanned out
// over several streams) and mirrors it. Both run `batch` same-shape instances at fixed strides.
// Calls enqueue work and return without waiting.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/cuda/lt_gemm.h"

namespace orthoserve::cuda {

// Matrices at least this large (m) use the strip form of SymmetricProduct by default.
inline constexpr int64_t kSymmetricMinSize = 1024;

// A stream, the cuBLASLt workspace products on it use, and an event that marks its work done.
struct Lane {
  cudaStream_t stream = nullptr;
  Workspace workspace;
  cudaEvent_t done = nullptr;
};

// Where the products of one caller run. Everything is ordered on `main`; the strips of a
// symmetric product may fan out to the `side` lanes (forked from `main` through `fork` and joined
// back before the product returns, also when it fails), so several strip GEMMs fill the GPU at
// once.
struct BlasDevice {
  LtGemm* lt = nullptr;
  Lane main;
  std::vector<Lane> side;
  cudaEvent_t fork = nullptr;
  GemmPrecision precision;
  int64_t symmetric_min_size = kSymmetricMinSize;  // Below it: one full GEMM, then the mirror.
};

// D = alpha·op(A)·op(B) + beta·C on the main lane.
absl::Status Gemm(const BlasDevice& dev, const GemmProblem& problem, const GemmOperands& operands);

// D = alpha·P·Pᵀ + beta·C (m × m, C and D with leading dim ldd) for P of m × k, per instance.
struct SymmetricProblem {
  const void* p = nullptr;
  bool stored_transposed = false;  // P is held as Pᵀ (k × m, column-major) rather than as P.
  int64_t m = 0, k = 0, ld = 0;    // ld: P's (or Pᵀ's) leading dim.
  int64_t batch = 1;
  int64_t stride_p = 0;            // Elements from one instance's P to the next.
  float alpha = 1.0f, beta = 0.0f;
  const void* c = nullptr;         // Null when beta = 0.
  void* d = nullptr;
  int64_t ldd = 0, stride_d = 0;   // C shares D's layout.
};

// Row starts of the strips for an m × m result: strip i covers rows [s[i], s[i+1]) (s ends with
// m) and columns [s[i], m). m < min_size gives {0, m}: one full GEMM. The layout depends only on
// m and min_size — never on the batch or on other tasks.
std::vector<int64_t> SymmetricStrips(int64_t m, int64_t min_size);

// The product; the result is exactly symmetric (the upper triangle is mirrored onto the lower).
absl::Status SymmetricProduct(const BlasDevice& dev, const SymmetricProblem& problem);

}  // namespace orthoserve::cuda
