// The progress timeout of streaming calls (--stream-progress-timeout, docs/operations.md): a call
// that waits on its client — for the client's next message, or for the client to read what was
// written — and sees nothing happen for the timeout is ended, so that a stalled or hostile client
// cannot hold a stream slot and its admitted bytes indefinitely. Waiting on the server (compute,
// a group's rendezvous) does not count. One thread checks every registered call a few times per
// timeout. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace orthoserve {

class ProgressWatchdog {
 public:
  // A watched call.
  class Call {
   public:
    virtual ~Call() = default;
    // Since when the call has been waiting on its client with nothing happening, or
    // absl::InfiniteFuture() when it is not waiting on its client.
    virtual absl::Time stalled_since() const = 0;
    // The call has been stalled for `stalled` (>= the timeout): end it. Called once, from the
    // watchdog's thread, with no lock of the watchdog held.
    virtual void ProgressTimedOut(absl::Duration stalled) = 0;
  };

  // `timeout` <= 0: no timeout (Register does nothing).
  explicit ProgressWatchdog(absl::Duration timeout);
  ~ProgressWatchdog();

  absl::Duration timeout() const { return timeout_; }
  // Watches `call` until Unregister(id) or until it timed out; returns its id.
  uint64_t Register(std::weak_ptr<Call> call);
  void Unregister(uint64_t id);

 private:
  void Loop();

  const absl::Duration timeout_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::weak_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace orthoserve
