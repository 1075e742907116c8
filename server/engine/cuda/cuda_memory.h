// CudaMemory: the CUDA backend's Memory (server/engine/memory.h) — buffers from the backend's
// device pool (under its budget), copies with cudaMemcpy2DAsync on a leased context's stream,
// waited for before returning and counted in CudaBackend::Copies() by direction. Internal to
// server/engine/cuda.
#pragma once

#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/memory.h"

namespace orthoserve {

class CudaMemory final : public Memory {
 public:
  explicit CudaMemory(CudaBackend::Impl& impl) : impl_(impl) {}

  MemorySpace space() const override { return MemorySpace::kDevice; }
  absl::StatusOr<MemoryBuffer> Allocate(size_t bytes, bool zero, const char* what) override;
  absl::Status Copy2d(const Copy2dArgs& args) override;
  absl::Status Zero(void* data, size_t bytes) override;
  // A kernel over the elements where they are; only the 8-byte verdict comes to the host.
  absl::StatusOr<int64_t> FindNonFinite(const void* data, DType dtype, int64_t count) override;

 private:
  CudaBackend::Impl& impl_;
};

}  // namespace orthoserve
