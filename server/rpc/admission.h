// Admission control for the public API (docs/operations.md): concurrent streams and matrix bytes held
// in flight, per server and per tenant. Over a limit a request gets RESOURCE_EXHAUSTED before
// anything is allocated — never an out-of-memory kill. Thread-safe.
//
// Fair stream slots. The server-wide stream limit L (--max-concurrent-streams) is shared by
// weight (--tenant-shares) between tenants, by reservation rather than preemption, under the rule
// of FairSlots (fair_slots.h): each tenant of the token file (Options::tenants) without traffic
// has one slot kept free for it, the rest is divided by weight among the tenants with traffic
// (each share at most --max-tenant-concurrent-streams when set), and a tenant borrows beyond its
// share only slots nobody waiting needs. The kept slots and shares add up to at most L, so a
// tenant under its share is refused only while others hold more than theirs, and the slots they
// release go to it, not back to them. A tenant alone (no token file, or no other tenant known or
// with traffic) uses the whole limit. Refusals by this rule count as limit "fair_share" in
// orthoserve_tenant_refusals_total. In-flight bytes are not shared this way (yet):
// --max-tenant-inflight-bytes bounds each tenant's. Unary calls have slots of their own
// (unary_gate.h).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fair_queue.h"
#include "server/metrics/metrics.h"
#include "server/rpc/fair_slots.h"

namespace orthoserve {

class Admission {
 public:
  struct Options {
    int64_t max_inflight_bytes = int64_t{4} << 30;         // Whole server.
    int64_t max_tenant_inflight_bytes = int64_t{2} << 30;  // Per tenant.
    int max_concurrent_streams = 64;
    int max_tenant_concurrent_streams = 0;   // Per tenant, a cap on top of its fair share; 0: none.
    double max_tenant_calls_per_second = 0;  // Calls a tenant may start in any second; 0: no limit.
    FairShares tenant_shares;                // Weights of the fair stream shares (--tenant-shares; priority unused).
    std::vector<std::string> tenants;        // The token file's tenants (repeats allowed); none: no token file.
    std::function<absl::Time()> clock;       // Time source of kFairShareMemory; null: absl::Now.
  };

  // How long a refused tenant keeps its reserve of stream slots after its last refusal.
  static constexpr absl::Duration kFairShareMemory = FairSlots::kFairShareMemory;

  // Holds admitted bytes (or a stream slot) until destroyed. Movable.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    void Release();
    int64_t bytes() const { return bytes_; }

   private:
    friend class Admission;
    Admission* owner_ = nullptr;
    std::string tenant_;
    int64_t bytes_ = 0;
    bool stream_ = false;
  };

  Admission(const Options& options, Metrics* metrics);

  // A new call (stream or unary) of `tenant`: RESOURCE_EXHAUSTED when the tenant started
  // max_tenant_calls_per_second calls within the last second (--max-tenant-calls-per-second),
  // naming its count and the limit. Refused calls do not count.
  absl::Status AdmitCall(const std::string& tenant);
  // A stream slot of `tenant`. RESOURCE_EXHAUSTED naming the limit, the figure and the limit's
  // value (--max-concurrent-streams, or --max-tenant-concurrent-streams with the tenant's own count),
  // or, under the fair-share rule above, the tenant's count, its share and the slots kept for others.
  absl::StatusOr<Ticket> AcquireStream(const std::string& tenant);
  // Adds `bytes` to `ticket` (which may already hold bytes of the same tenant). RESOURCE_EXHAUSTED
  // naming the limit (--max-inflight-bytes or --max-tenant-inflight-bytes) and `what`.
  absl::Status AddBytes(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what);

  // Like AddBytes, but when what is short is the server's budget (--max-inflight-bytes), waits in
  // arrival order until released bytes make room, then adds them to `*ticket` and calls
  // done(OK). done(error) comes at once when the tenant's own limit refuses, or when `bytes`
  // exceed the whole budget. `done` runs on the thread that released the bytes (or this one),
  // with no lock held; `*ticket` must stay valid until it ran or CancelWait returned true.
  // Returns the wait's id (0 when `done` ran already).
  uint64_t AddBytesWhenAvailable(Ticket* ticket, const std::string& tenant, int64_t bytes, std::string what,
                                 std::function<void(absl::Status)> done);
  // Makes `ticket` (of `tenant`) hold `bytes` in all: fewer are returned at once; more are added
  // as AddBytes would (RESOURCE_EXHAUSTED naming `what` and the limit, the ticket unchanged).
  absl::Status Resize(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what);
  // Stops a wait: true when it was still waiting (its `done` will not run).
  bool CancelWait(uint64_t id);

  int64_t inflight_bytes() const;
  size_t waiting() const;  // Waits queued by AddBytesWhenAvailable.

 private:
  struct Waiter {
    uint64_t id;
    Ticket* ticket;
    std::string tenant;
    int64_t bytes;
    std::string what;
    std::function<void(absl::Status)> done;
  };
  enum class Short { kNone, kServer, kTenant };

  // The `limit` label of a stream slot refused by `refusal`.
  static const char* RefusalLimit(FairSlots::Refusal refusal);

  // Adds `bytes` to `ticket` if both limits allow; otherwise says which is short and, with
  // `refuse`, counts the refusal and returns its RESOURCE_EXHAUSTED. Requires mu_.
  absl::Status TryAddLocked(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what,
                            bool refuse, Short* shortage) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants (or refuses, for their tenant's limit) the waiters at the head of the queue that
  // fit; their callbacks go to `ready`. Requires mu_.
  void DrainWaitersLocked(std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Return(const std::string& tenant, int64_t bytes, bool stream);
  // The most bytes any tenant holds (for the tenant gauge with labels off). Requires mu_.
  int64_t LargestTenantBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }

  const Options options_;
  Metrics* metrics_;  // Optional.
  mutable absl::Mutex mu_;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  FairSlots streams_ ABSL_GUARDED_BY(mu_);  // The stream slots.
  absl::flat_hash_map<std::string, int64_t> tenant_bytes_ ABSL_GUARDED_BY(mu_);
  // Start times of each tenant's calls within the last second (with a call-rate limit only).
  absl::flat_hash_map<std::string, std::deque<absl::Time>> tenant_calls_ ABSL_GUARDED_BY(mu_);
  absl::Time calls_swept_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // When tenant_calls_ was last swept.
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace orthoserve
