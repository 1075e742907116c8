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
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

void FairPool::Schedule(const std::string& tenant, const std::string& job, double cost,
                        std::function<void()> closure) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.Push(tenant, job, cost, std::move(closure));
      cv_.notify_one();
      return;
    }
  }
  closure();
}

size_t FairPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void FairPool::Work() {
  for (;;) {
    std::function<void()> closure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Stopping and drained.
      closure = queue_.Pop();
    }
    closure();
  }
}

}  // namespace orthoserve
