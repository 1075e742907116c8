// Running callbacks outside the lock that decided them: a thread that completes waiters (the
// coordinator's and the store's notifiers) collects the completions under its mutex and calls
// them with the mutex released, so that a callback may take other locks or call back in.
#pragma once

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace orthoserve {

// Calls every function of `calls` in order with `mu` released, clears `calls`, and takes `mu`
// again. The caller holds `mu` before and after (and must not rely on what it guarded staying
// the same across the call).
inline void CallUnlocked(absl::Mutex& mu, std::vector<std::function<void()>>& calls)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  mu.Unlock();
  for (std::function<void()>& call : calls) call();
  calls.clear();
  mu.Lock();
}

}  // namespace orthoserve
