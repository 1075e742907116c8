// InMemoryStore: map + absl::Mutex + absl::CondVar.
#include "server/collective/in_memory_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace orthoserve {

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value) {
  {
    absl::MutexLock lock(&mu_);
    values_[key] = std::string(value);
  }
  changed_.SignalAll();
  return absl::OkStatus();
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
