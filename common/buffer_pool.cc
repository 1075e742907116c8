// Implementation of common/buffer_pool.h.
#include "common/buffer_pool.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace orthoserve {

PooledBuffer::~PooledBuffer() { pool_->Release(std::move(bytes_), capacity_); }

std::shared_ptr<BufferPool> BufferPool::Create(const Options& options) {
  return std::shared_ptr<BufferPool>(new BufferPool(options));
}

absl::StatusOr<std::shared_ptr<PooledBuffer>> BufferPool::Get(size_t size) {
  std::unique_ptr<char[]> bytes;
  size_t capacity = size;
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.lower_bound(size);
    if (it != idle_.end() && it->first <= size + size / 8) {
      capacity = it->first;
      bytes = std::move(it->second);
      idle_.erase(it);
      idle_bytes_ -= static_cast<int64_t>(capacity);
    }
  }
  if (bytes == nullptr) {
    // new char[] leaves the bytes uninitialized: the block's chunks or the backend fill them.
    bytes.reset(new (std::nothrow) char[size]);
    if (bytes == nullptr && size > 0) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", size, "-byte matrix buffer"));
    }
  }
  return std::shared_ptr<PooledBuffer>(new PooledBuffer(shared_from_this(), std::move(bytes), capacity, size));
}

int64_t BufferPool::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

void BufferPool::Release(std::unique_ptr<char[]> bytes, size_t capacity) {
  absl::MutexLock lock(&mu_);
  if (bytes == nullptr || idle_bytes_ + static_cast<int64_t>(capacity) > options_.max_idle_bytes) return;
  idle_bytes_ += static_cast<int64_t>(capacity);
  idle_.emplace(capacity, std::move(bytes));
}

}  // namespace orthoserve
