// Element-wise and reduction kernels of the CUDA backend (everything that is not a GEMM):
// norms, conversions between fp32/bf16/fp16, the fused normalize and scale passes, and the
// mirror of a triangle computed by the symmetric products. Each launcher enqueues on `stream`
// and returns the launch error (cudaGetLastError), never waiting for the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"

namespace orthoserve::cuda {

// Doubles of scratch SumSquares needs.
inline constexpr int kSumSquaresScratch = 1024;

// *result = Σ x² over `n` elements of `dtype`, accumulated in double in a fixed order (the same
// bits every run for the same input). `scratch` holds kSumSquaresScratch doubles.
cudaError_t SumSquares(DType dtype, const void* x, int64_t n, double* scratch, double* result, cudaStream_t stream);

// out[i] = work(in[i] / d) with d = max(√sumsq, eps) (add_eps false) or √sumsq + eps, computed
// in fp32; `work` is kF32 or kBF16 (rounded to nearest even). `sumsq` is a device scalar.
cudaError_t Normalize(DType in_dtype, const void* in, int64_t n, const double* sumsq, float eps, bool add_eps,
                      DType work, void* out, cudaStream_t stream);

// out[i] = out_dtype(float(x[i]) · scale): the final widening, scaling and narrowing.
cudaError_t ScaleConvert(DType x_dtype, const void* x, int64_t n, float scale, DType out_dtype, void* out,
                         cudaStream_t stream);

// Copies the upper triangle (row <= col) of the column-major m × m matrix `c` onto its lower one.
cudaError_t MirrorUpper(DType dtype, void* c, int64_t m, int64_t ld, cudaStream_t stream);

// dst[i] = (first ? 0 : dst[i]) + float(src[i]) for `n` elements of `src_dtype`.
cudaError_t AccumulateF32(DType src_dtype, const void* src, int64_t n, float* dst, bool first, cudaStream_t stream);

// Launches a kernel with an invalid configuration (more threads per block than any device
// allows) and returns the resulting error: the test hook for the backend's error path.
cudaError_t LaunchInvalidConfigForTest(cudaStream_t stream);

}  // namespace orthoserve::cuda
