// Implementation of common/fair_pool.h.
#include "common/fair_pool.h"

#include <algorithm>
#include <utility>

namespace orthoserve {

FairPool::FairPool(int threads, Shares shares) : queue_(std::move(shares)) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { Work(); });
}

FairPool::~FairPool() {
  Shutdown();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void FairPool::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

void FairPool::Schedule(const std::string& tenant, const std::string& job, double cost,
                        std::function<void()> closure) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.Push(tenant, job, cost, std::move(closure));
      cv_.Signal();
      return;
    }
  }
  closure();
}

size_t FairPool::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void FairPool::Work() {
  for (;;) {
    std::function<void()> closure;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping and drained.
      closure = queue_.Pop();
    }
    closure();
  }
}

}  // namespace orthoserve
