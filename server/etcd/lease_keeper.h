// LeaseKeeper: keeps one etcd lease alive from a background thread through the LeaseKeepAlive
// stream, and says when the lease is lost.
//
// Contract: the thread sends a keep-alive every `interval` (default a third of the TTL) and
// reopens the stream, failing over across endpoints, when it breaks. The lease is lost when
// etcd answers with TTL <= 0 (expired or revoked: NOT_FOUND) or when no keep-alive has been
// acknowledged for a whole TTL (UNAVAILABLE: etcd may already have expired it). Loss is final:
// the thread stops, status() returns the reason and `on_lost` is called once, on the keeper's
// thread, with no lock held. Stopping (Stop or the destructor) joins the thread and does not
// revoke the lease: its keys then live until the TTL runs out (revoke it with EtcdClient to
// drop them at once). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/etcd/endpoint_pool.h"

namespace orthoserve::etcd {

class LeaseKeeper {
 public:
  struct Options {
    int64_t lease_id = 0;                                        // The lease to keep (from GrantLease).
    absl::Duration ttl = absl::ZeroDuration();                   // Its TTL as granted (Lease::ttl_seconds).
    absl::Duration interval = absl::ZeroDuration();              // Between keep-alives; zero: ttl / 3.
    std::function<void(const absl::Status&)> on_lost = nullptr;  // Called once on loss.
  };

  // Starts the thread; `pool` must outlive the keeper. INVALID_ARGUMENT for a zero lease id,
  // a TTL under one second, or an interval not under the TTL.
  static absl::StatusOr<std::unique_ptr<LeaseKeeper>> Start(EndpointPool* pool, Options options);

  // Stops and joins the thread (at most about one dial timeout).
  ~LeaseKeeper();

  // Stops keeping the lease alive and joins the thread; idempotent.
  void Stop();

  // OK while the lease is kept alive; NOT_FOUND (expired or revoked) or UNAVAILABLE (no
  // acknowledgement for a whole TTL) once lost; CANCELLED after Stop.
  absl::Status status() const;

  // When the last acknowledged keep-alive was sent (the start time before the first).
  absl::Time last_renewed() const;

  int64_t lease_id() const { return options_.lease_id; }

 private:
  LeaseKeeper(EndpointPool* pool, Options options);

  void Run();
  // One stream's life: keep-alives until it breaks (returns OK), the lease is lost (returns
  // the reason) or the keeper stops (returns CANCELLED).
  absl::Status RunStream();
  bool Stopping() const;
  // Sleeps until `until` or Stop, whichever comes first.
  void SleepUntil(absl::Time until);
  // Records an acknowledged keep-alive; the new TTL counts from when it was `sent`.
  void Renewed(absl::Time sent, int64_t ttl_seconds);
  absl::Time ExpiresAt() const;

  EndpointPool* const pool_;
  const Options options_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time last_renewed_ ABSL_GUARDED_BY(mu_);
  absl::Duration last_ttl_ ABSL_GUARDED_BY(mu_);
  std::function<void()> cancel_stream_ ABSL_GUARDED_BY(mu_);  // Cancels the open stream, if any.
  std::thread thread_;
};

}  // namespace orthoserve::etcd
