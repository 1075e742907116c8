// Implementation of server/engine/cuda/cuda_handles.h.
#include "server/engine/cuda/cuda_handles.h"

#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"

namespace orthoserve::cuda {

absl::StatusOr<Stream> CreateStream() {
  cudaStream_t s = nullptr;
  RETURN_IF_ERROR(CudaCall(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  return Stream(s);
}

absl::StatusOr<Event> CreateEvent(bool timing) {
  cudaEvent_t e = nullptr;
  RETURN_IF_ERROR(
      CudaCall(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate"));
  return Event(e);
}

absl::StatusOr<DeviceMemory> AllocateDevice(size_t bytes) {
  void* p = nullptr;
  RETURN_IF_ERROR(CudaCall(cudaMalloc(&p, bytes), "cudaMalloc"));
  return DeviceMemory(p);
}

absl::StatusOr<PinnedMemory> AllocatePinned(size_t bytes) {
  void* p = nullptr;
  RETURN_IF_ERROR(CudaCall(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc"));
  return PinnedMemory(p);
}

}  // namespace orthoserve::cuda
