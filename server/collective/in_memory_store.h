// InMemoryStore: a Store held in this process's memory, for tests and one-process fleets whose
// ranks are threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
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
  // Completes waiting GetAsync calls with CANCELLED and joins the notifier thread.
  ~InMemoryStore() override;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override ABSL_LOCKS_EXCLUDED(mu_);

  // Get without a thread that waits (the fleet service's StoreGet): `done` runs exactly once,
  // without the store's lock, with what Get would return — within this call when the key is set
  // (or `timeout` is not positive: DEADLINE_EXCEEDED), otherwise on the store's one notifier
  // thread (started by the first such wait) when the key is set or added to, when the timeout
  // passes, or with CANCELLED at StopWaits or destruction. `done` must not block.
  using GetDone = std::function<void(absl::StatusOr<std::string>)>;
  void GetAsync(absl::string_view key, absl::Duration timeout, GetDone done) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every waiting GetAsync call now with CANCELLED, and any later one that would wait (the
  // server that serves them shuts down). Get and Wait are not affected.
  void StopWaits() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiter {
    std::string key;
    absl::Duration timeout;
    absl::Time deadline;
    GetDone done;
  };
  // Completes GetAsync waiters as keys come, deadlines pass or waits are cancelled.
  void NotifyLoop() ABSL_LOCKS_EXCLUDED(mu_);

  // Keys of `keys` not in the map yet.
  std::vector<std::string> MissingLocked(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::CondVar changed_;  // Signalled (outside mu_) when a key is set or added to.
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  absl::CondVar notify_cv_;  // Signalled when a key changes, a waiter comes, or waits are cancelled.
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stop_waits_ ABSL_GUARDED_BY(mu_) = false;  // StopWaits: GetAsync does not wait.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;       // The destructor: the notifier stops.
  std::thread notifier_ ABSL_GUARDED_BY(mu_);       // Started by the first waiting GetAsync.
};

}  // namespace orthoserve
