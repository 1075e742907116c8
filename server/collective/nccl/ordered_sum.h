// The device kernel behind NcclCollective's deterministic AllReduceSum: sums `world` gathered
// contributions element-wise in rank order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace orthoserve::nccl_internal {

// out[i] = ((in[0·count + i] + in[1·count + i]) + ...) + in[(world-1)·count + i], for float and
// double. Enqueues on `stream`; returns the launch error.
cudaError_t OrderedSum(const float* in, int world, size_t count, float* out, cudaStream_t stream);
cudaError_t OrderedSum(const double* in, int world, size_t count, double* out, cudaStream_t stream);

}  // namespace orthoserve::nccl_internal
