// Implementation of server/collective/nccl/ordered_sum.h.
#include <algorithm>

#include "server/collective/nccl/ordered_sum.h"

namespace orthoserve::nccl_internal {
namespace {

template <typename T>
__global__ void OrderedSumKernel(const T* in, int world, size_t count, T* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    T acc = in[i];
    for (int r = 1; r < world; ++r) acc = acc + in[r * count + i];
    out[i] = acc;
  }
}

template <typename T>
cudaError_t Launch(const T* in, int world, size_t count, T* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr unsigned kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((count + kThreads - 1) / kThreads, 65535));
  cudaGetLastError();  // Clear an earlier call's error so that only this launch's is returned.
  OrderedSumKernel<T><<<blocks, kThreads, 0, stream>>>(in, world, count, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t OrderedSum(const float* in, int world, size_t count, float* out, cudaStream_t stream) {
  return Launch(in, world, count, out, stream);
}
cudaError_t OrderedSum(const double* in, int world, size_t count, double* out, cudaStream_t stream) {
  return Launch(in, world, count, out, stream);
}

}  // namespace orthoserve::nccl_internal
