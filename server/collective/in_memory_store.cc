// InMemoryStore: map + mutex + condition variable.
#include "server/collective/in_memory_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orthoserve {
namespace {

// The steady-clock time `timeout` from now; an infinite (or huge) timeout becomes ten years,
// which keeps the clock arithmetic from overflowing.
std::chrono::steady_clock::time_point WaitDeadline(absl::Duration timeout) {
  const absl::Duration bounded = std::clamp(timeout, absl::ZeroDuration(), absl::Hours(24 * 3650));
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(bounded);
}

}  // namespace

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::string(value);
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  const auto deadline = WaitDeadline(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = values_.find(key);
  while (it == values_.end()) {
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
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
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::FailedPreconditionError(
          absl::StrCat("store key '", key, "' holds '", it->second, "', not an integer counter"));
    }
    value += delta;
    values_[key] = absl::StrCat(value);
  }
  changed_.notify_all();
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
  const auto deadline = WaitDeadline(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (MissingLocked(keys).empty()) return absl::OkStatus();
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      const std::vector<std::string> missing = MissingLocked(keys);
      if (missing.empty()) return absl::OkStatus();
      return absl::DeadlineExceededError(absl::StrCat("store keys not set within ", absl::FormatDuration(timeout),
                                                      ": '", absl::StrJoin(missing, "', '"), "'"));
    }
  }
}

}  // namespace orthoserve
