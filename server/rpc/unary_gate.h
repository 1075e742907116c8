// UnaryGate: the slots of unary Orthogonalize calls, and a bounded waiter queue that is fair
// between tenants. Thread-safe.
//
// A unary call takes a slot before it reserves room for its body (unary_call.h) and keeps it
// until it ends. The server's max_concurrent slots are shared by weight between tenants under
// the rule of FairSlots (fair_slots.h, the same as stream slots: --tenant-shares, one slot kept
// for each token file tenant without traffic), and max_tenant_concurrent caps each tenant on
// top. A call that gets no slot waits in its tenant's queue (arrival order within a tenant);
// when a slot frees, the waiting tenant with the fewest slots per weight that the rule lets
// have it gets it. At most max_waiters calls wait in all: when the queue is full, a call of a
// tenant that holds less than its weighted part of the queue (among the tenants waiting and
// itself) pushes out the newest waiter of the tenant most over its part; otherwise the new call
// is refused. Both are RESOURCE_EXHAUSTED naming --max-unary-waiters, counted as limit
// "unary_waiters" in orthoserve_tenant_refusals_total (the new call) and cause "pushed_out" in
// orthoserve_tenant_cuts_total (the waiter pushed out). So one tenant's stalled calls hold at
// most its share of the slots another tenant needs, and at most its part of the queue.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fair_queue.h"
#include "server/metrics/metrics.h"
#include "server/rpc/fair_slots.h"

namespace orthoserve {

class UnaryGate {
 public:
  struct Options {
    int max_concurrent = 32;            // Unary calls holding a slot, whole server (--max-concurrent-unary).
    int max_tenant_concurrent = 0;      // Per tenant, a cap on top of its fair share; 0: none.
    int max_waiters = 256;              // Calls waiting for a slot, whole server (--max-unary-waiters).
    FairShares tenant_shares;           // Weights of slots and queue parts (--tenant-shares; priority unused).
    std::vector<std::string> tenants;   // The token file's tenants (repeats allowed); none: no token file.
    std::function<absl::Time()> clock;  // Time source of FairSlots::kFairShareMemory; null: absl::Now.
  };

  // A slot, held until destroyed or Release(). Movable.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }
    void Release();
    bool held() const { return gate_ != nullptr; }

   private:
    friend class UnaryGate;
    UnaryGate* gate_ = nullptr;
    std::string tenant_;
  };

  UnaryGate(const Options& options, Metrics* metrics);

  // Asks for a slot for `tenant`. When one is granted (at once, or later in the fair order above)
  // `*slot` holds it and done(OK) runs; done(RESOURCE_EXHAUSTED) runs when the queue is full for
  // this tenant, or later when the waiter is pushed out. `done` runs on the calling thread or on
  // the thread that freed the slot or pushed it out, with no lock held; `*slot` must stay valid
  // until `done` ran or CancelWait returned true. Returns the wait's id (0 when `done` ran already).
  uint64_t Acquire(Slot* slot, const std::string& tenant, std::function<void(absl::Status)> done);
  // Stops a wait: true when it was still waiting (its `done` will not run).
  bool CancelWait(uint64_t id);

  int held() const;        // Slots held.
  size_t waiting() const;  // Calls waiting.
  const Options& options() const { return options_; }

 private:
  struct Waiter {
    uint64_t id;
    Slot* slot;
    std::function<void(absl::Status)> done;
  };
  using Ready = std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>;

  void Release(const std::string& tenant);
  // Marks every tenant with waiters that a slot could help (under its cap) as waiting, so that
  // the fair rule keeps their reserve however long they wait. Requires mu_.
  void TouchWaitingLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants free slots to waiters in the fair order; their callbacks go to `ready`. Requires mu_.
  void GrantLocked(Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a waiter of `tenant`, pushing out another tenant's (its callback to `ready`) when the
  // queue is full; RESOURCE_EXHAUSTED when the tenant may not queue. Requires mu_.
  absl::Status EnqueueLocked(const std::string& tenant, Waiter waiter, Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `tenant`'s part of the queue among the tenants waiting and itself. Requires mu_.
  int QueuePartLocked(const std::string& tenant, double weight_sum) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }

  const Options options_;
  Metrics* const metrics_;  // Optional.
  mutable absl::Mutex mu_;
  FairSlots slots_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<Waiter>> queues_ ABSL_GUARDED_BY(mu_);  // Per tenant; none empty.
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace orthoserve
