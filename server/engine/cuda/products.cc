// Implementation of server/engine/cuda/products.h.
#include "server/engine/cuda/products.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"
#include "server/engine/cuda/kernels.h"

namespace orthoserve::cuda {
namespace {

bool FitsInt(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

const char* Offset(const void* p, int64_t elements, size_t element_size) {
  return static_cast<const char*>(p) + elements * static_cast<int64_t>(element_size);
}

}  // namespace

GemmPrecision ForPrecision(Precision precision) {
  switch (precision) {
    case Precision::kMedium:
      return GemmPrecision{DType::kBF16, CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    case Precision::kHigh:
      return GemmPrecision{DType::kF32, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    case Precision::kHighest:
      break;
  }
  return GemmPrecision{DType::kF32, CUDA_R_32F, CUBLAS_COMPUTE_32F};
}

absl::Status Gemm(cublasHandle_t handle, const GemmPrecision& p, cublasOperation_t op_a, cublasOperation_t op_b,
                  int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                  float beta, void* c, int64_t ldc) {
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(lda) || !FitsInt(ldb) || !FitsInt(ldc)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM of ", m, "x", n, "x", k, " exceeds cuBLAS's 32-bit dimensions"));
  }
  // Scale type float for all three compute types (CUBLAS_COMPUTE_32F*).
  return CublasCall(cublasGemmEx(handle, op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                 &alpha, a, p.data_type, static_cast<int>(lda), b, p.data_type, static_cast<int>(ldb),
                                 &beta, c, p.data_type, static_cast<int>(ldc), p.compute, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx");
}

absl::Status SymmetricProduct(cublasHandle_t handle, cudaStream_t stream, const GemmPrecision& p, const void* pbuf,
                              bool stored_transposed, int64_t m, int64_t k, int64_t ld, float alpha, float beta,
                              void* c, int64_t ldc) {
  const size_t es = p.element_size();
  // P rows [r0, ...) as the left operand and Pᵀ columns [r0, ...) as the right one.
  const cublasOperation_t op_left = stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_right = stored_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;
  auto rows_from = [&](int64_t r0) { return Offset(pbuf, stored_transposed ? r0 * ld : r0, es); };

  if (m < kSymmetricMinSize) {
    RETURN_IF_ERROR(Gemm(handle, p, op_left, op_right, m, m, k, alpha, pbuf, ld, pbuf, ld, beta, c, ldc));
  } else {
    // Strips of 1/8 of m (rounded up to 128 rows, at least 512): the upper triangle plus the
    // diagonal blocks cost (S+1)/(2S) of the full product, 56% for S = 8.
    const int64_t strips = std::min<int64_t>(8, m / 512);
    int64_t height = (m + strips - 1) / strips;
    height = (height + 127) / 128 * 128;
    for (int64_t r0 = 0; r0 < m; r0 += height) {
      const int64_t r1 = std::min(m, r0 + height);
      void* c_block = const_cast<char*>(Offset(c, r0 + r0 * ldc, es));
      RETURN_IF_ERROR(Gemm(handle, p, op_left, op_right, r1 - r0, m - r0, k, alpha, rows_from(r0), ld, rows_from(r0),
                           ld, beta, c_block, ldc));
    }
  }
  return CudaCall(MirrorUpper(p.dtype, c, m, ldc, stream), "MirrorUpper");
}

}  // namespace orthoserve::cuda
