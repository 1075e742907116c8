// InMemoryStore: a Store held in this process's memory, for tests and one-process fleets whose
// ranks are threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "server/collective/store.h"

namespace orthoserve {

// Implements the Store contract (store.h) with a map under a mutex; Get and Wait block on a
// condition variable until the keys appear or the timeout passes (DEADLINE_EXCEEDED naming
// the missing keys). Add keeps counters as decimal strings, so Get on a counter returns its
// value as text; Add on a key whose value is not an integer is FAILED_PRECONDITION. Never
// UNAVAILABLE. Thread-safe. (std::mutex rather than absl::Mutex: ThreadSanitizer understands
// it without an instrumented abseil, so multi-rank tests stay checkable.)
class InMemoryStore final : public Store {
 public:
  InMemoryStore() = default;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  // Keys of `keys` not in the map yet.
  std::vector<std::string> MissingLocked(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::mutex mu_;
  std::condition_variable changed_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve
