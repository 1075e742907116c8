// Implementation of common/thread_pool.h.
#include "common/thread_pool.h"

#include <algorithm>

namespace orthoserve {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  Shutdown();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

void ThreadPool::Schedule(std::function<void()> closure) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(closure));
      cv_.notify_one();
      return;
    }
  }
  closure();
}

size_t ThreadPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void ThreadPool::Work() {
  for (;;) {
    std::function<void()> closure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Stopping and drained.
      closure = std::move(queue_.front());
      queue_.pop_front();
    }
    closure();
  }
}

}  // namespace orthoserve
