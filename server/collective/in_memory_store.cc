// InMemoryStore: map + absl::Mutex + absl::CondVar.
#include "server/collective/in_memory_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "common/call_unlocked.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace orthoserve {

InMemoryStore::~InMemoryStore() {
  std::thread notifier;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    notify_cv_.SignalAll();
    notifier.swap(notifier_);
  }
  if (notifier.joinable()) notifier.join();
}

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value) {
  {
    absl::MutexLock lock(&mu_);
    values_[key] = std::string(value);
    if (!waiters_.empty()) notify_cv_.SignalAll();
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

void InMemoryStore::GetAsync(absl::string_view key, absl::Duration timeout, GetDone done) {
  absl::StatusOr<std::string> now;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      now = it->second;
    } else if (stop_waits_) {
      now = absl::CancelledError(absl::StrCat("the store stopped waiting for key '", key, "'"));
    } else if (timeout <= absl::ZeroDuration()) {
      now = absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' was not set within ", absl::FormatDuration(timeout)));
    } else {
      waiters_.push_back(Waiter{std::string(key), timeout, absl::Now() + timeout, std::move(done)});
      if (!notifier_.joinable()) notifier_ = std::thread([this] { NotifyLoop(); });
      notify_cv_.SignalAll();  // Its deadline may be the next.
      return;
    }
  }
  done(std::move(now));
}

void InMemoryStore::StopWaits() {
  absl::MutexLock lock(&mu_);
  stop_waits_ = true;
  notify_cv_.SignalAll();
}

void InMemoryStore::NotifyLoop() {
  std::vector<std::function<void()>> ready;
  // Completes `waiter` with `value` (after the loop has released the lock).
  auto complete = [&ready](Waiter& waiter, absl::StatusOr<std::string> value) {
    ready.push_back([done = std::move(waiter.done), value = std::move(value)]() mutable { done(std::move(value)); });
  };
  mu_.Lock();
  for (;;) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    const bool cancel = stop_waits_ || closing_;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto value = values_.find(it->key);
      if (value != values_.end()) {
        complete(*it, value->second);
      } else if (cancel) {
        complete(*it, absl::CancelledError(absl::StrCat("the store stopped waiting for key '", it->key, "'")));
      } else if (now >= it->deadline) {
        complete(*it, absl::DeadlineExceededError(absl::StrCat("store key '", it->key, "' was not set within ",
                                                               absl::FormatDuration(it->timeout))));
      } else {
        next = std::min(next, it->deadline);
        ++it;
        continue;
      }
      it = waiters_.erase(it);
    }
    if (!ready.empty()) {
      CallUnlocked(mu_, ready);
      continue;  // More may have come meanwhile.
    }
    if (closing_) break;
    notify_cv_.WaitWithDeadline(&mu_, next);  // Either way: go round.
  }
  mu_.Unlock();
}

absl::StatusOr<std::string> InMemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  // Saturating: an infinite timeout is an infinite deadline, a negative one has passed.
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  while (it == values_.end()) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) {  // True: the deadline passed.
      it = values_.find(key);
      if (it != values_.end()) break;
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' was not set within ", absl::FormatDuration(timeout)));
    }
    it = values_.find(key);
  }
  return it->second;
}

absl::StatusOr<int64_t> InMemoryStore::Add(absl::string_view key, int64_t delta) {
  int64_t value = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::FailedPreconditionError(
          absl::StrCat("store key '", key, "' holds '", it->second, "', not an integer counter"));
    }
    value += delta;
    values_[key] = absl::StrCat(value);
    if (!waiters_.empty()) notify_cv_.SignalAll();
  }
  changed_.SignalAll();
  return value;
}

std::vector<std::string> InMemoryStore::MissingLocked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!values_.contains(key)) missing.push_back(key);
  }
  return missing;
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;  // Saturating, as in Get.
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (MissingLocked(keys).empty()) return absl::OkStatus();
    if (changed_.WaitWithDeadline(&mu_, deadline)) {  // True: the deadline passed.
      const std::vector<std::string> missing = MissingLocked(keys);
      if (missing.empty()) return absl::OkStatus();
      return absl::DeadlineExceededError(absl::StrCat("store keys not set within ", absl::FormatDuration(timeout),
                                                      ": '", absl::StrJoin(missing, "', '"), "'"));
    }
  }
}

}  // namespace orthoserve
