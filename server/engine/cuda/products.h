// The matrix products of Newton–Schulz on cuBLAS at each precision: a plain GEMM with the
// beta-accumulating epilogue, and the symmetric product P·Pᵀ that computes only the upper
// triangle (in row strips) and mirrors it.
//
// Every buffer is column-major device memory. With HIGHEST the operands and accumulation are
// fp32 (CUBLAS_COMPUTE_32F, no TF32); HIGH uses CUBLAS_COMPUTE_32F_FAST_TF32; MEDIUM reads
// bf16, accumulates in fp32 and writes bf16: C = bf16(alpha·op(A)·op(B) + beta·C), one rounding
// per output. Calls enqueue on the handle's stream and return without waiting.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/ns_options.h"

namespace orthoserve::cuda {

struct GemmPrecision {
  DType dtype = DType::kF32;  // Element type of the working buffers (kF32 or kBF16).
  cudaDataType_t data_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  size_t element_size() const { return ElementSize(dtype); }
};

GemmPrecision ForPrecision(Precision precision);

// Matrices at least this large (m) use the strip form of SymmetricProduct.
inline constexpr int64_t kSymmetricMinSize = 1024;

// C = alpha·op(A)·op(B) + beta·C with C m × n. INVALID_ARGUMENT when a dimension exceeds int;
// INTERNAL "cublasGemmEx: CUBLAS_STATUS_...".
absl::Status Gemm(cublasHandle_t handle, const GemmPrecision& p, cublasOperation_t op_a, cublasOperation_t op_b,
                  int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                  float beta, void* c, int64_t ldc);

// C (m × m, leading dim ldc) = alpha·P·Pᵀ + beta·C for P of m × k. P is stored column-major
// with leading dim `ld`, either as P itself (`stored_transposed` false) or as Pᵀ (k × m).
// For m >= kSymmetricMinSize only the upper triangle is computed, one GEMM per row strip
// [r0, r1) × [r0, m), then mirrored, so C is exactly symmetric; smaller C uses one full GEMM
// followed by the same mirror. The strip layout depends only on m, never on other tasks.
absl::Status SymmetricProduct(cublasHandle_t handle, cudaStream_t stream, const GemmPrecision& p, const void* pbuf,
                              bool stored_transposed, int64_t m, int64_t k, int64_t ld, float alpha, float beta,
                              void* c, int64_t ldc);

}  // namespace orthoserve::cuda
