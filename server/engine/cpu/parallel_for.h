// A fixed set of worker threads that run the index range of a ParallelFor call; the caller's
// own thread takes part, so a pool of T threads has T - 1 workers.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace orthoserve {

// Contract: Run(count, fn) calls fn(i) exactly once for every i in [0, count) and returns when
// all calls have returned. Which thread runs which index is unspecified, so fn(i) must write only
// to data owned by index i; results are then independent of the scheduling. Thread-safety: Run
// may be called from several threads at once; their ranges share the workers and each caller
// also works on its own range, so no call waits on another's. fn must not throw.
class ParallelFor {
 public:
  // threads >= 1: the number of threads that work on one Run (the caller and threads - 1 workers).
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  int threads() const { return threads_; }

  void Run(int64_t count, const std::function<void(int64_t)>& fn) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Range;
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  static bool Drain(Range& range);

  const int threads_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // Signalled when a range is queued or the pool stops.
  std::deque<std::shared_ptr<Range>> queue_ ABSL_GUARDED_BY(mu_);  // Ranges with indices left to hand out.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // Set by the constructor, joined by the destructor.
};

}  // namespace orthoserve
