// Implementation of server/engine/cuda/memory_pool.h.
#include "server/engine/cuda/memory_pool.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "server/engine/cuda/cuda_status.h"

namespace orthoserve::cuda {

void MemoryPool::Block::Reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Release(data_, size_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

MemoryPool::~MemoryPool() { Trim(); }

size_t MemoryPool::RoundUp(size_t bytes) {
  constexpr size_t kSmall = 512;              // Alignment of small blocks.
  constexpr size_t kLarge = size_t{2} << 20;  // Large blocks in 2 MiB units.
  if (bytes == 0) bytes = 1;
  if (bytes <= (size_t{1} << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

int64_t MemoryPool::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

int64_t MemoryPool::in_use_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_ - cached_;
}

void MemoryPool::Free(const std::vector<void*>& blocks) const {
  // Only the driver is called here; the books were updated by whoever took the blocks out.
  for (void* data : blocks) {
    if (options_.kind == Kind::kDevice) {
      cudaFree(data);
    } else {
      cudaFreeHost(data);
    }
  }
}

void MemoryPool::Allocate(size_t size, void** data, int* error) const {
  *error = options_.kind == Kind::kDevice ? cudaMalloc(data, size) : cudaHostAlloc(data, size, cudaHostAllocDefault);
}

std::vector<void*> MemoryPool::EvictLocked(size_t need) {
  std::vector<void*> victims;
  const int64_t budget = options_.budget_bytes;
  while (!cache_.empty() && (budget == 0 || held_ + static_cast<int64_t>(need) > budget)) {
    auto it = std::prev(cache_.end());
    victims.push_back(it->second);
    held_ -= static_cast<int64_t>(it->first);
    cached_ -= static_cast<int64_t>(it->first);
    cache_.erase(it);
  }
  return victims;
}

void MemoryPool::Trim() {
  std::vector<void*> victims;
  {
    absl::MutexLock lock(&mu_);
    victims = FlushLocked();
  }
  Free(victims);
}

std::vector<void*> MemoryPool::FlushLocked() {
  std::vector<void*> victims;
  for (auto& [size, data] : cache_) {
    victims.push_back(data);
    held_ -= static_cast<int64_t>(size);
    cached_ -= static_cast<int64_t>(size);
  }
  cache_.clear();
  return victims;
}

absl::StatusOr<MemoryPool::Block> MemoryPool::Acquire(size_t bytes, absl::string_view what) {
  const size_t size = RoundUp(bytes);
  const int64_t budget = options_.budget_bytes;
  const char* kind = options_.kind == Kind::kDevice ? "device" : "pinned host";
  // Everything below runs under the lock, the driver calls included: the bytes the driver holds
  // for this pool then never exceed the budget, even for a moment between two callers.
  absl::MutexLock lock(&mu_);
  // Reuse a cached block no more than 25% larger than asked.
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first <= size + size / 4) {
    Block block(this, it->second, it->first);
    cached_ -= static_cast<int64_t>(it->first);
    cache_.erase(it);
    return block;
  }
  if (budget > 0 && (held_ - cached_) + static_cast<int64_t>(size) > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": needs ", size, " more bytes of ", kind, " memory; ",
                                                     held_ - cached_, " of the budget of ", budget,
                                                     " bytes are in use"));
  }
  if (budget > 0) Free(EvictLocked(size));
  void* data = nullptr;
  int error = cudaSuccess;
  Allocate(size, &data, &error);
  if (error == cudaErrorMemoryAllocation && !cache_.empty()) {
    cudaGetLastError();  // Allocation failures are not sticky; clear it and retry with an empty cache.
    Free(FlushLocked());
    Allocate(size, &data, &error);
  }
  if (error != cudaSuccess) {
    if (error == cudaErrorMemoryAllocation) cudaGetLastError();
    absl::Status status = CudaCall(static_cast<cudaError_t>(error),
                                   options_.kind == Kind::kDevice ? "cudaMalloc" : "cudaHostAlloc");
    return absl::Status(status.code(),
                        absl::StrCat(what, ": ", size, " bytes of ", kind, " memory: ", status.message()));
  }
  held_ += static_cast<int64_t>(size);
  return Block(this, data, size);
}

void MemoryPool::Release(void* data, size_t size) {
  {
    absl::MutexLock lock(&mu_);
    if (options_.max_cached_bytes == 0 || cached_ + static_cast<int64_t>(size) <= options_.max_cached_bytes) {
      cache_.emplace(size, data);
      cached_ += static_cast<int64_t>(size);
      return;
    }
    held_ -= static_cast<int64_t>(size);
    if (options_.budget_bytes > 0) {
      Free({data});  // Under the lock, so that the budget holds at the driver too.
      return;
    }
  }
  Free({data});
}

}  // namespace orthoserve::cuda
