// A fixed-size pool of worker threads that runs queued closures in weighted fair order between
// tenants, and fairly between the jobs of a tenant (common/fair_queue.h) — the compute queue of
// a server shared by several training jobs (docs/operations.md, "Sharing a server between
// tenants"). Each closure belongs to a flow (tenant, job) and has a cost (the server uses
// Newton–Schulz FLOPs). Closures of one flow never run out of order relative to each other's
// dispatch, but several may run at once on different workers.
//
// Thread-safe. The destructor runs every closure already queued, then joins the workers;
// closures scheduled after Shutdown() are run inline by the caller instead of being dropped, so
// a closure that owns a promise always fulfils it.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/fair_queue.h"

namespace orthoserve {

class FairPool {
 public:
  using Share = FairShare;
  using Shares = FairShares;

  explicit FairPool(int threads, Shares shares = {});
  ~FairPool();
  FairPool(const FairPool&) = delete;
  FairPool& operator=(const FairPool&) = delete;

  // Queues `closure` for flow (tenant, job) with `cost` (>= 0).
  void Schedule(const std::string& tenant, const std::string& job, double cost, std::function<void()> closure)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `closure` in the anonymous flow ("", "") at cost 0.
  void Schedule(std::function<void()> closure) { Schedule("", "", 0, std::move(closure)); }

  // Closures queued and not yet started.
  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Work() ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // Signalled when a closure is queued or the pool stops.
  FairQueue<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // Set by the constructor, joined by the destructor.
};

}  // namespace orthoserve
