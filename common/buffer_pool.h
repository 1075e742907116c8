// Reusable memory for matrix bytes on their way through the service and the client (docs/architecture.md):
// a server stream's input and result blocks, a client's outgoing chunks. Buffers come from here
// instead of fresh allocations, which the kernel would have to map and zero page by page, and are
// handed out uninitialized; each is at most 1/8 larger than asked for. Released buffers are kept
// for the next request of about the same size, up to a cap, and freed beyond it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace orthoserve {

class BufferPool;

// `size()` bytes at `data()`, uninitialized when handed out; the memory goes back to its pool
// when the buffer is destroyed (it keeps the pool alive until then).
class PooledBuffer {
 public:
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  ~PooledBuffer();

  char* data() const { return bytes_.get(); }
  size_t size() const { return size_; }

 private:
  friend class BufferPool;
  PooledBuffer(std::shared_ptr<BufferPool> pool, std::unique_ptr<char[]> bytes, size_t capacity, size_t size)
      : pool_(std::move(pool)), bytes_(std::move(bytes)), capacity_(capacity), size_(size) {}

  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<char[]> bytes_;
  size_t capacity_;
  size_t size_;
};

// Thread-safe.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  struct Options {
    int64_t max_idle_bytes = int64_t{512} << 20;  // Released buffers kept for reuse, in all.
  };

  static std::shared_ptr<BufferPool> Create(const Options& options);

  // A buffer of `size` bytes: a released one of capacity size to size + size/8 when there is
  // one (the smallest), else a new one. RESOURCE_EXHAUSTED when the memory cannot be allocated.
  absl::StatusOr<std::shared_ptr<PooledBuffer>> Get(size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes held in released buffers, waiting for reuse.
  int64_t idle_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PooledBuffer;
  explicit BufferPool(const Options& options) : options_(options) {}
  // Keeps `bytes` for reuse if they fit under max_idle_bytes, else frees them.
  void Release(std::unique_ptr<char[]> bytes, size_t capacity) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, std::unique_ptr<char[]>> idle_ ABSL_GUARDED_BY(mu_);  // By capacity.
  int64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace orthoserve
