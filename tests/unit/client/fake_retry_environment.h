// A RetryEnvironment for tests: a clock that only moves when the loop sleeps, the sleeps it was
// asked for, and jitter that returns a fixed fraction of each bound.
#pragma once

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/retry.h"

namespace orthoserve::client::testing {

class FakeRetryEnvironment final : public RetryEnvironment {
 public:
  // Jitter(bound) returns bound · `jitter_fraction`.
  explicit FakeRetryEnvironment(double jitter_fraction = 1.0) : jitter_fraction_(jitter_fraction) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Sleep(absl::Duration duration) override {
    absl::MutexLock lock(&mu_);
    now_ += duration;
    sleeps_.push_back(duration);
  }
  absl::Duration Jitter(absl::Duration bound) override {
    absl::MutexLock lock(&mu_);
    bounds_.push_back(bound);
    return bound * jitter_fraction_;
  }
  // Moves the clock without a sleep (time an attempt took).
  void Advance(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    now_ += duration;
  }

  std::vector<absl::Duration> sleeps() {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }
  std::vector<absl::Duration> bounds() {
    absl::MutexLock lock(&mu_);
    return bounds_;
  }

 private:
  const double jitter_fraction_;
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::UnixEpoch();
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> bounds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve::client::testing
