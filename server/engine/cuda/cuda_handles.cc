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

absl::StatusOr<CublasHandle> CreateCublas(cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  RETURN_IF_ERROR(CublasCall(cublasCreate(&h), "cublasCreate"));
  CublasHandle owned(h);
  RETURN_IF_ERROR(CublasCall(cublasSetStream(h, stream), "cublasSetStream"));
  // Precision is chosen per call through the compute type; the handle itself never allows
  // TF32 or reduced-precision reductions behind our back.
  RETURN_IF_ERROR(CublasCall(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  RETURN_IF_ERROR(CublasCall(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode"));
  return owned;
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
