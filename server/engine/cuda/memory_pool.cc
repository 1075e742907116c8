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

void MemoryPool::FreeLocked(void* data) {
  if (options_.kind == Kind::kDevice) {
    cudaFree(data);
  } else {
    cudaFreeHost(data);
  }
}

void MemoryPool::EvictLocked(size_t need) {
  const int64_t budget = options_.budget_bytes;
  while (!cache_.empty() && (budget == 0 || held_ + static_cast<int64_t>(need) > budget)) {
    auto it = std::prev(cache_.end());
    FreeLocked(it->second);
    held_ -= static_cast<int64_t>(it->first);
    cached_ -= static_cast<int64_t>(it->first);
    cache_.erase(it);
  }
}

void MemoryPool::Trim() {
  absl::MutexLock lock(&mu_);
  FlushLocked();
}

void MemoryPool::FlushLocked() {
  for (auto& [size, data] : cache_) {
    FreeLocked(data);
    held_ -= static_cast<int64_t>(size);
    cached_ -= static_cast<int64_t>(size);
  }
  cache_.clear();
}

absl::StatusOr<MemoryPool::Block> MemoryPool::Acquire(size_t bytes, absl::string_view what) {
  const size_t size = RoundUp(bytes);
  absl::MutexLock lock(&mu_);
  // Reuse a cached block no more than 25% larger than asked.
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first <= size + size / 4) {
    Block block(this, it->second, it->first);
    cached_ -= static_cast<int64_t>(it->first);
    cache_.erase(it);
    return block;
  }
  const int64_t budget = options_.budget_bytes;
  const char* kind = options_.kind == Kind::kDevice ? "device" : "pinned host";
  if (budget > 0 && (held_ - cached_) + static_cast<int64_t>(size) > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": needs ", size, " more bytes of ", kind, " memory; ",
                                                     held_ - cached_, " of the budget of ", budget,
                                                     " bytes are in use"));
  }
  if (budget > 0) EvictLocked(size);
  void* data = nullptr;
  cudaError_t error =
      options_.kind == Kind::kDevice ? cudaMalloc(&data, size) : cudaHostAlloc(&data, size, cudaHostAllocDefault);
  if (error == cudaErrorMemoryAllocation && !cache_.empty()) {
    cudaGetLastError();  // Allocation failures are not sticky; clear it and retry with an empty cache.
    FlushLocked();
    error = options_.kind == Kind::kDevice ? cudaMalloc(&data, size) : cudaHostAlloc(&data, size, cudaHostAllocDefault);
  }
  if (error != cudaSuccess) {
    if (error == cudaErrorMemoryAllocation) cudaGetLastError();
    absl::Status status = CudaCall(error, options_.kind == Kind::kDevice ? "cudaMalloc" : "cudaHostAlloc");
    return absl::Status(status.code(),
                        absl::StrCat(what, ": ", size, " bytes of ", kind, " memory: ", status.message()));
  }
  held_ += static_cast<int64_t>(size);
  return Block(this, data, size);
}

void MemoryPool::Release(void* data, size_t size) {
  absl::MutexLock lock(&mu_);
  if (options_.max_cached_bytes > 0 && cached_ + static_cast<int64_t>(size) > options_.max_cached_bytes) {
    FreeLocked(data);
    held_ -= static_cast<int64_t>(size);
    return;
  }
  cache_.emplace(size, data);
  cached_ += static_cast<int64_t>(size);
}

}  // namespace orthoserve::cuda
