// MemoryPool: a caching allocator of device memory (with a byte budget) or pinned host memory
// (staging for copies), so that steady-state tasks allocate nothing.
//
// Contract. Acquire returns a Block of at least `bytes` bytes, reusing a cached allocation when
// one of a close size is free. The budget bounds the bytes the pool holds (in use + cached):
// cached blocks are freed to make room, and a request that cannot fit under the budget, or that
// the driver cannot satisfy, gets RESOURCE_EXHAUSTED naming the sizes — never a crash. A Block
// returns its memory to the pool when destroyed; the caller must make sure no stream still uses
// it by then. The pool must outlive its blocks. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace orthoserve::cuda {

class MemoryPool {
 public:
  enum class Kind { kDevice, kPinnedHost };

  struct Options {
    Kind kind = Kind::kDevice;     // cudaMalloc or cudaHostAlloc.
    int64_t budget_bytes = 0;      // Most bytes held (in use + cached); 0 = no limit.
    int64_t max_cached_bytes = 0;  // Free bytes kept for reuse beyond which releases free; 0 = no limit.
  };

  // Memory from the pool; returns itself on destruction. Move-only.
  class Block {
   public:
    Block() = default;
    ~Block() { Reset(); }
    Block(Block&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
    Block& operator=(Block&& o) noexcept {
      if (this != &o) {
        Reset();
        pool_ = std::exchange(o.pool_, nullptr);
        data_ = std::exchange(o.data_, nullptr);
        size_ = o.size_;
      }
      return *this;
    }
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;

    void* data() const { return data_; }
    size_t size() const { return size_; }
    template <typename T>
    T* as() const {
      return static_cast<T*>(data_);
    }
    void Reset();

   private:
    friend class MemoryPool;
    Block(MemoryPool* pool, void* data, size_t size) : pool_(pool), data_(data), size_(size) {}
    MemoryPool* pool_ = nullptr;
    void* data_ = nullptr;
    size_t size_ = 0;
  };

  explicit MemoryPool(const Options& options) : options_(options) {}
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // `what` names the use in the RESOURCE_EXHAUSTED message ("task 3 working set").
  absl::StatusOr<Block> Acquire(size_t bytes, absl::string_view what);

  // Frees every cached (unused) allocation.
  void Trim();

  int64_t budget_bytes() const { return options_.budget_bytes; }
  int64_t held_bytes() const;
  int64_t in_use_bytes() const;

  // The size an allocation of `bytes` is rounded up to (the unit budgets are counted in).
  static size_t RoundUp(size_t bytes);

 private:
  // The *Locked helpers take blocks out of the books and hand them back to be freed. Acquire
  // frees and allocates under the mutex (so the driver never holds more than the budget);
  // Release past the cache cap (the pinned pool, which has no budget) and Trim free outside it,
  // since cudaFree / cudaFreeHost may wait for the device.
  void Release(void* data, size_t size);
  void Free(const std::vector<void*>& blocks) const;
  void Allocate(size_t size, void** data, int* error) const;
  // Takes cached blocks, largest first, until `held_ + need <= budget` or none is left.
  std::vector<void*> EvictLocked(size_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes every cached block.
  std::vector<void*> FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, void*> cache_ ABSL_GUARDED_BY(mu_);  // Free allocations by size.
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cached_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace orthoserve::cuda
