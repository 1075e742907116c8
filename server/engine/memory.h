// Memory a backend computes in, for callers that keep data there between backend calls: the
// distributed algorithms hold a batch's blocks in the backend's memory so that on a GPU rank they
// go up once, travel between ranks device to device and come down once (docs/architecture.md,
// "Memory spaces").
//
// Contract. A Memory hands out buffers in its space and copies rectangles between its space and
// host memory (or within either). Host memory (HostMemory, the cpu backend's) makes every copy a
// memcpy; a device memory (the cuda backend's) makes cudaMemcpy2D calls and counts them in
// Backend::Copies(). Every call is complete when it returns (the copy has landed; a buffer is
// usable by any stream), so buffers pass between the backend, a collective and the host without
// further synchronization. Errors: RESOURCE_EXHAUSTED when a buffer does not fit the backend's
// budget, INTERNAL for a device failure. Thread-safe; a Buffer must not outlive its Memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace orthoserve {

// Where a pointer handed to a backend lives: host memory, or the backend's device memory
// (Backend::memory() when its space() is kDevice).
enum class MemorySpace { kHost, kDevice };

// A buffer of a Memory; frees itself when destroyed. Move-only.
class MemoryBuffer {
 public:
  MemoryBuffer() = default;
  MemoryBuffer(void* data, size_t size, std::function<void()> release)
      : data_(data), size_(size), release_(std::move(release)) {}
  ~MemoryBuffer() { Reset(); }
  MemoryBuffer(MemoryBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), release_(std::move(o.release_)) {
    o.release_ = nullptr;
  }
  MemoryBuffer& operator=(MemoryBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      release_ = std::exchange(o.release_, nullptr);
    }
    return *this;
  }
  MemoryBuffer(const MemoryBuffer&) = delete;
  MemoryBuffer& operator=(const MemoryBuffer&) = delete;

  char* data() const { return static_cast<char*>(data_); }
  size_t size() const { return size_; }
  void Reset() {
    if (release_) release_();
    release_ = nullptr;
    data_ = nullptr;
    size_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::function<void()> release_;
};

// A copy of `rows` rows of `row_bytes` bytes, row i from src + i·src_pitch to dst + i·dst_pitch.
// Each side is host memory or the Memory's own space, as its `*_space` says.
struct Copy2dArgs {
  void* dst = nullptr;
  size_t dst_pitch = 0;
  MemorySpace dst_space = MemorySpace::kHost;
  const void* src = nullptr;
  size_t src_pitch = 0;
  MemorySpace src_space = MemorySpace::kHost;
  size_t rows = 0;
  size_t row_bytes = 0;
};

class Memory {
 public:
  virtual ~Memory() = default;

  // kHost: buffers are host memory. kDevice: the backend's device memory.
  virtual MemorySpace space() const = 0;

  // A buffer of `bytes` bytes in this space, its contents unspecified; zeroed when `zero`.
  // `what` names the use in a RESOURCE_EXHAUSTED message. Zero bytes give an empty buffer.
  virtual absl::StatusOr<MemoryBuffer> Allocate(size_t bytes, bool zero, const char* what) = 0;

  // The copy `args` describes; nothing for zero rows or bytes. The regions must not overlap.
  virtual absl::Status Copy2d(const Copy2dArgs& args) = 0;

  // Sets `bytes` bytes at `data` (in this space) to zero.
  virtual absl::Status Zero(void* data, size_t bytes) = 0;

  // The index of the first NaN or Inf among `count` elements of `dtype` at `data` (in this space,
  // aligned to the element size), or -1 when all are finite: how the step layer checks an input
  // that stays where the client put it (a shared-memory region) before it is computed.
  virtual absl::StatusOr<int64_t> FindNonFinite(const void* data, DType dtype, int64_t count) = 0;

  // A contiguous copy of `bytes` bytes (one row).
  absl::Status Copy(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space, size_t bytes) {
    return Copy2d(Copy2dArgs{dst, bytes, dst_space, src, bytes, src_space, 1, bytes});
  }
};

// Host memory: new[]/delete[] and memcpy. The cpu backend's memory, and the memory the
// distributed algorithms keep blocks in when the backend or the collective works on host memory.
class HostMemory final : public Memory {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  absl::StatusOr<MemoryBuffer> Allocate(size_t bytes, bool zero, const char* what) override;
  absl::Status Copy2d(const Copy2dArgs& args) override;
  absl::Status Zero(void* data, size_t bytes) override;
  absl::StatusOr<int64_t> FindNonFinite(const void* data, DType dtype, int64_t count) override;
};

}  // namespace orthoserve
