// Watcher: follows every change under a key prefix from a given revision, on its own thread,
// through etcd's Watch stream, and resumes where it left off when the stream breaks.
//
// Contract: events reach `on_events` in revision order, each exactly once, on the watcher's
// thread with no lock held (a callback may call the EtcdClient, but must not Stop or destroy
// its own Watcher). After a broken stream (a member restarted, a connection reset) the watcher
// reopens it, failing over across endpoints, from the revision after the last one delivered,
// so nothing is missed or repeated. It ends for good only on Stop (CANCELLED) or when the
// revision it needs has been compacted away (OUT_OF_RANGE; `on_ended` is called once with it:
// the owner should re-read the prefix and watch again). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/etcd/endpoint_pool.h"
#include "server/etcd/etcd_types.h"

namespace orthoserve::etcd {

class Watcher {
 public:
  struct Options {
    std::string prefix;          // Watch keys starting with it (empty: every key).
    int64_t start_revision = 0;  // First revision to deliver; 0: changes after Start returns.
    std::function<void(const std::vector<WatchEvent>& events)> on_events = nullptr;  // Required.
    std::function<void(const absl::Status& status)> on_ended = nullptr;              // Optional: compacted.
    absl::Duration retry_interval = absl::Milliseconds(200);                         // Pause before reopening a stream.
  };

  // Opens the watch and returns once etcd has confirmed it (changes from then on, or from
  // `start_revision`, will be delivered). `pool` must outlive the watcher. INVALID_ARGUMENT
  // without `on_events`; UNAVAILABLE when no endpoint answers within the dial and call
  // timeouts; OUT_OF_RANGE when `start_revision` has been compacted.
  static absl::StatusOr<std::unique_ptr<Watcher>> Start(EndpointPool* pool, Options options);

  // Stops and joins the thread (within about one dial timeout: a connection attempt in
  // progress is not interrupted).
  ~Watcher();

  // Stops watching and joins the thread; idempotent. Must not be called from `on_events`.
  void Stop();

  // OK while watching; OUT_OF_RANGE once compacted; CANCELLED after Stop.
  absl::Status status() const;

  // The revision the watch continues from: one past the last delivered event.
  int64_t next_revision() const;

  // How many times the stream was reopened after breaking.
  int restarts() const;

  // Cancels the current stream as a network failure would (for tests of the resumption).
  void BreakStreamForTesting();

 private:
  struct Stream;

  Watcher(EndpointPool* pool, Options options);

  // Opens a stream from next_revision_ and waits for etcd's confirmation until `deadline`.
  absl::StatusOr<std::unique_ptr<Stream>> OpenStream(absl::Time deadline);
  // Asks etcd for the watch on a new `stream` and waits for the confirmation.
  absl::StatusOr<std::unique_ptr<Stream>> Confirm(std::unique_ptr<Stream> stream, absl::Time deadline);
  void Run(std::unique_ptr<Stream> stream);
  // Delivers the events of one stream until it breaks (OK), the watch ends (OUT_OF_RANGE) or
  // the watcher stops (CANCELLED).
  absl::Status Follow(Stream& stream);
  bool Stopping() const;
  void SleepUntil(absl::Time until);

  EndpointPool* const pool_;
  const Options options_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t next_revision_ ABSL_GUARDED_BY(mu_) = 0;
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;  // The open stream, to cancel it; not owned.
  std::thread thread_;
};

}  // namespace orthoserve::etcd
