// Element-wise and reduction kernels of the CUDA backend (everything that is not a GEMM):
// norms, conversions between fp32/bf16/fp16, the fused normalize and scale passes, and the
// mirror of a triangle computed by the symmetric products. Each launcher enqueues on `stream`
// and returns the launch error (cudaGetLastError), never waiting for the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"

namespace orthoserve::cuda {

// Batched kernels work on `batch` matrices of `n` elements each, stored back to back.

// Doubles of scratch SumSquares needs for `batch` matrices of `n` elements: at most
// kSumSquaresMaxScratch per matrix.
inline constexpr int64_t kSumSquaresMaxScratch = 1024;
int64_t SumSquaresScratch(int64_t n, int64_t batch);

// result[j] = Σ x² over the `n` elements of matrix j, accumulated in double in an order fixed by
// n alone (the same bits every run, whatever the batch); with `bf16_input` each x is rounded to
// bf16 first (Normalization::kBf16). `scratch` holds SumSquaresScratch doubles; `batch` <= 65535.
cudaError_t SumSquares(DType dtype, const void* x, int64_t n, int64_t batch, bool bf16_input, double* scratch,
                       double* result, cudaStream_t stream);

// out[j·n + i] = work(in[j·n + i] / d_j) with d_j = fp32(max(√sumsq[j], eps)) (add_eps false) or
// fp32(√sumsq[j] + eps), the divisor formed in double and rounded once, the division in fp32 (no
// division when d_j = 0, as on the CPU backend); `work` is kF32 or kBF16 (rounded to nearest
// even). `sumsq` holds `batch` device doubles. With `bf16` (Normalization::kBf16, server/engine/
// backend.h) each input is rounded to bf16 first and d_j = max(bf16(fp32(√sumsq[j])), bf16(eps))
// (bf16 of their sum with add_eps).
cudaError_t Normalize(DType in_dtype, const void* in, int64_t n, int64_t batch, const double* sumsq, double eps,
                      bool add_eps, bool bf16, DType work, void* out, cudaStream_t stream);

// out[i] = out_dtype(float(x[i]) · scale): the final widening, scaling and narrowing.
cudaError_t ScaleConvert(DType x_dtype, const void* x, int64_t n, float scale, DType out_dtype, void* out,
                         cudaStream_t stream);

// Copies the upper triangle (row <= col) of each column-major m × m matrix onto its lower one;
// matrix j starts `stride` elements after matrix j − 1.
cudaError_t MirrorUpper(DType dtype, void* c, int64_t m, int64_t ld, int64_t batch, int64_t stride,
                        cudaStream_t stream);

// dst[i] = (first ? 0 : dst[i]) + float(src[i]) for `n` elements of `src_dtype`.
cudaError_t AccumulateF32(DType src_dtype, const void* src, int64_t n, float* dst, bool first, cudaStream_t stream);

// *out = ((0 + v[0]) + v[1]) + ... + v[n-1] in double, in index order (0 for n = 0): the sum of
// a participant's shard norms, in the order the host adds them.
cudaError_t SumInOrder(const double* v, int64_t n, double* out, cudaStream_t stream);

// *first = min(*first, i) over the indices i < n whose element of `x` is NaN or Inf (one pass);
// *first must hold ULLONG_MAX (no verdict yet) before. The scan of an input that stays in device
// memory (a CUDA IPC region) before it is computed.
cudaError_t FirstNonFinite(DType dtype, const void* x, int64_t n, unsigned long long* first, cudaStream_t stream);

// Launches a kernel with an invalid configuration (more threads per block than any device
// allows) and returns the resulting error: the test hook for the backend's error path.
cudaError_t LaunchInvalidConfigForTest(cudaStream_t stream);

}  // namespace orthoserve::cuda
