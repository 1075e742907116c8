// A fixed-size pool of worker threads running queued closures in FIFO order.
//
// Thread-safe. The destructor runs every closure already queued, then joins the workers;
// closures scheduled after Shutdown() are run inline by the caller instead of being dropped, so
// a closure that owns a promise always fulfils it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace orthoserve {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> closure);
  // Closures queued and not yet started.
  size_t queued() const;
  void Shutdown();

 private:
  void Work();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace orthoserve
