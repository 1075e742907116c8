// Implementation of server/rpc/progress_watchdog.h.
#include "server/rpc/progress_watchdog.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace orthoserve {

ProgressWatchdog::ProgressWatchdog(absl::Duration timeout) : timeout_(timeout) {
  if (timeout_ > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

ProgressWatchdog::~ProgressWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // Wakes the loop's wait (its condition).
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t ProgressWatchdog::Register(std::weak_ptr<Call> call) {
  if (timeout_ <= absl::ZeroDuration()) return 0;
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  calls_.emplace(id, std::move(call));
  return id;
}

void ProgressWatchdog::Unregister(uint64_t id) {
  if (id == 0) return;
  absl::MutexLock lock(&mu_);
  calls_.erase(id);
}

void ProgressWatchdog::Loop() {
  // A stalled call is ended between 1 and 1.25 timeouts after it stalled.
  const absl::Duration period = std::clamp(timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  for (;;) {
    std::vector<std::pair<uint64_t, std::shared_ptr<Call>>> live;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
      if (stopping_) return;
      live.reserve(calls_.size());
      for (auto it = calls_.begin(); it != calls_.end();) {
        std::shared_ptr<Call> call = it->second.lock();
        if (call == nullptr) {
          calls_.erase(it++);
        } else {
          live.emplace_back(it->first, std::move(call));
          ++it;
        }
      }
    }
    const absl::Time now = absl::Now();
    std::vector<std::pair<std::shared_ptr<Call>, absl::Duration>> expired;
    for (auto& [id, call] : live) {
      const absl::Time since = call->stalled_since();
      if (since == absl::InfiniteFuture() || now - since < timeout_) continue;
      expired.emplace_back(std::move(call), now - since);
      absl::MutexLock lock(&mu_);
      calls_.erase(id);  // Timed out once only.
    }
    live.clear();
    for (auto& [call, stalled] : expired) call->ProgressTimedOut(stalled);
  }
}

}  // namespace orthoserve
