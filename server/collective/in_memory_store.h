// InMemoryStore: a Store held in this process's memory, for tests and one-process fleets whose
// ranks are threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/collective/store.h"

namespace orthoserve {

// Implements the Store contract (store.h) with a map under a mutex; Get and Wait block on a
// condition variable until the keys appear or the timeout passes (DEADLINE_EXCEEDED naming
// the missing keys). Add keeps counters as decimal strings, so Get on a counter returns its
// value as text; Add on a key whose value is not an integer is FAILED_PRECONDITION. Never
// UNAVAILABLE. Thread-safe. (Debian's abseil is not built for ThreadSanitizer, which therefore
// cannot see this absl::Mutex: see server/collective/README.md.)
class InMemoryStore final : public Store {
 public:
  InMemoryStore() = default;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Keys of `keys` not in the map yet.
  std::vector<std::string> MissingLocked(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::CondVar changed_;  // Signalled (outside mu_) when a key is set or added to.
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve
