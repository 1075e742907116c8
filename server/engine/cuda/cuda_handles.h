// RAII owners for the CUDA runtime and cuBLASLt handles the backend uses: streams, events, CUDA
// graphs, cuBLASLt handles and descriptors, device and pinned host allocations. Each is
// move-only and releases its handle in the destructor (errors there are ignored: nothing can be
// done about them during teardown).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace orthoserve::cuda {

// A move-only owner of one handle of type T, released by Traits::Release.
template <typename T, typename Traits>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T handle) : handle_(handle) {}
  ~Owned() { Reset(); }
  Owned(Owned&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, T{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  T get() const { return handle_; }
  explicit operator bool() const { return handle_ != T{}; }
  void Reset() {
    if (handle_ != T{}) Traits::Release(handle_);
    handle_ = T{};
  }

 private:
  T handle_{};
};

struct StreamTraits {
  static void Release(cudaStream_t s) { cudaStreamDestroy(s); }
};
struct EventTraits {
  static void Release(cudaEvent_t e) { cudaEventDestroy(e); }
};
struct GraphTraits {
  static void Release(cudaGraph_t g) { cudaGraphDestroy(g); }
};
struct GraphExecTraits {
  static void Release(cudaGraphExec_t g) { cudaGraphExecDestroy(g); }
};
struct LtHandleTraits {
  static void Release(cublasLtHandle_t h) { cublasLtDestroy(h); }
};
struct LtMatmulDescTraits {
  static void Release(cublasLtMatmulDesc_t d) { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutTraits {
  static void Release(cublasLtMatrixLayout_t l) { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreferenceTraits {
  static void Release(cublasLtMatmulPreference_t p) { cublasLtMatmulPreferenceDestroy(p); }
};
struct DeviceMemoryTraits {
  static void Release(void* p) { cudaFree(p); }
};
struct PinnedMemoryTraits {
  static void Release(void* p) { cudaFreeHost(p); }
};

using Stream = Owned<cudaStream_t, StreamTraits>;
using Event = Owned<cudaEvent_t, EventTraits>;
using Graph = Owned<cudaGraph_t, GraphTraits>;
using GraphExec = Owned<cudaGraphExec_t, GraphExecTraits>;
using LtHandle = Owned<cublasLtHandle_t, LtHandleTraits>;
using LtMatmulDesc = Owned<cublasLtMatmulDesc_t, LtMatmulDescTraits>;
using LtLayout = Owned<cublasLtMatrixLayout_t, LtLayoutTraits>;
using LtPreference = Owned<cublasLtMatmulPreference_t, LtPreferenceTraits>;
using DeviceMemory = Owned<void*, DeviceMemoryTraits>;
using PinnedMemory = Owned<void*, PinnedMemoryTraits>;

// Creators; errors as cuda_status.h (INTERNAL, RESOURCE_EXHAUSTED for allocations).
absl::StatusOr<Stream> CreateStream();  // Non-blocking with respect to the legacy stream.
absl::StatusOr<Event> CreateEvent(bool timing = false);
absl::StatusOr<DeviceMemory> AllocateDevice(size_t bytes);
absl::StatusOr<PinnedMemory> AllocatePinned(size_t bytes);

}  // namespace orthoserve::cuda
