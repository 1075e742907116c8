// Implementation of server/engine/cuda/cuda_memory.h.
#include "server/engine/cuda/cuda_memory.h"

#include <cuda_runtime.h>

#include <climits>
#include <memory>

#include "common/status.h"
#include "server/engine/cuda/cuda_backend_impl.h"
#include "server/engine/cuda/cuda_status.h"
#include "server/engine/cuda/kernels.h"

namespace orthoserve {

using cuda::CudaCall;

absl::StatusOr<MemoryBuffer> CudaMemory::Allocate(size_t bytes, bool zero, const char* what) {
  if (bytes == 0) return MemoryBuffer();
  RETURN_IF_ERROR(CudaCall(cudaSetDevice(impl_.device), "cudaSetDevice"));
  ASSIGN_OR_RETURN(cuda::MemoryPool::Block block, impl_.device_pool.Acquire(bytes, what));
  if (zero) RETURN_IF_ERROR(Zero(block.data(), bytes));
  // The pool's block travels inside the release function, which returns it to the pool.
  auto held = std::make_shared<cuda::MemoryPool::Block>(std::move(block));
  void* data = held->data();
  return MemoryBuffer(data, bytes, [held] { held->Reset(); });
}

absl::Status CudaMemory::Copy2d(const Copy2dArgs& a) {
  if (a.rows == 0 || a.row_bytes == 0) return absl::OkStatus();
  const bool src_device = a.src_space == MemorySpace::kDevice;
  const bool dst_device = a.dst_space == MemorySpace::kDevice;
  const cudaMemcpyKind kind = src_device ? (dst_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                         : (dst_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  ASSIGN_OR_RETURN(auto lease, impl_.Take());
  cudaStream_t stream = (*lease)->h2d.get();
  RETURN_IF_ERROR(impl_.Copy2d(a.dst, a.dst_pitch, a.src, a.src_pitch, a.row_bytes, a.rows, kind, stream,
                               "cudaMemcpy2DAsync"));
  return CudaCall(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status CudaMemory::Zero(void* data, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto lease, impl_.Take());
  cudaStream_t stream = (*lease)->h2d.get();
  RETURN_IF_ERROR(CudaCall(cudaMemsetAsync(data, 0, bytes, stream), "cudaMemsetAsync"));
  return CudaCall(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::StatusOr<int64_t> CudaMemory::FindNonFinite(const void* data, DType dtype, int64_t count) {
  if (count <= 0) return -1;
  ASSIGN_OR_RETURN(auto lease, impl_.Take());
  cudaStream_t stream = (*lease)->h2d.get();
  ASSIGN_OR_RETURN(cuda::MemoryPool::Block verdict,
                   impl_.device_pool.Acquire(sizeof(unsigned long long), "the non-finite scan"));
  RETURN_IF_ERROR(CudaCall(cudaMemsetAsync(verdict.data(), 0xff, sizeof(unsigned long long), stream),
                           "cudaMemsetAsync"));  // ULLONG_MAX: nothing found yet.
  RETURN_IF_ERROR(
      CudaCall(cuda::FirstNonFinite(dtype, data, count, verdict.as<unsigned long long>(), stream), "FirstNonFinite"));
  unsigned long long first = 0;
  // The 8-byte verdict comes down (counted in Copies() as one device-to-host copy); the data stays.
  RETURN_IF_ERROR(
      impl_.Copy(&first, verdict.data(), sizeof(first), cudaMemcpyDeviceToHost, stream, "cudaMemcpyAsync(D2H)"));
  RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  return first == ULLONG_MAX ? int64_t{-1} : static_cast<int64_t>(first);
}

}  // namespace orthoserve
