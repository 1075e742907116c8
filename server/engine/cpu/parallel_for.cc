// Implementation of server/engine/cpu/parallel_for.h.
#include "server/engine/cpu/parallel_for.h"

#include <atomic>

namespace orthoserve {

struct ParallelFor::Range {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t count = 0;
  std::atomic<int64_t> next{0};  // Next index to hand out.
  absl::Mutex mu;
  absl::CondVar done_cv;                 // Signalled when the last index is finished.
  int64_t done ABSL_GUARDED_BY(mu) = 0;  // Indices finished.
};

ParallelFor::ParallelFor(int threads) : threads_(threads < 1 ? 1 : threads) {
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ParallelFor::~ParallelFor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

// Runs indices of `range` until none are left to hand out. Returns true when this call
// finished the last index.
bool ParallelFor::Drain(Range& range) {
  int64_t finished = 0;
  for (int64_t i = range.next.fetch_add(1); i < range.count; i = range.next.fetch_add(1)) {
    (*range.fn)(i);
    ++finished;
  }
  if (finished == 0) return false;
  absl::MutexLock lock(&range.mu);
  range.done += finished;
  if (range.done == range.count) {
    range.done_cv.SignalAll();
    return true;
  }
  return false;
}

void ParallelFor::Run(int64_t count, const std::function<void(int64_t)>& fn) {
  if (count <= 0) return;
  if (threads_ == 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  auto range = std::make_shared<Range>();
  range->fn = &fn;
  range->count = count;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(range);
  }
  cv_.SignalAll();
  Drain(*range);
  absl::MutexLock lock(&range->mu);
  while (range->done != range->count) range->done_cv.Wait(&range->mu);
}

void ParallelFor::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Range> range;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      range = queue_.front();
      // A range whose indices are all handed out leaves the queue; its owner waits for it.
      if (range->next.load() >= range->count) {
        queue_.pop_front();
        continue;
      }
    }
    Drain(*range);
    absl::MutexLock lock(&mu_);
    if (!queue_.empty() && queue_.front() == range) queue_.pop_front();
  }
}

}  // namespace orthoserve
