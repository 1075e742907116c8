// FairSlots: a number of slots (stream slots, unary call slots) shared by weight between
// tenants, by reservation rather than preemption — the rule admission.h describes for
// --max-concurrent-streams, kept here once for every kind of slot. Thread-compatible: the owner
// guards it with its own lock (Admission, UnaryGate).
//
// A tenant "has traffic" while it asks for a slot, while it holds one, and for
// kFairShareMemory after it was last refused one (it is "waiting"; a queue of waiters keeps its
// tenants waiting with Touch). Each known tenant (the token file's) without traffic has one slot
// kept free for it, if its weighted part of the limit among all known tenants and those with
// traffic is at least one slot; the rest is divided by weight among the tenants with traffic, a
// tenant's share being the floor of its part (at most `cap` when set). A tenant under its share
// gets a slot when one is free beyond the kept slots; a tenant at or over its share gets one
// only when, after it, the free slots also cover what every waiting tenant lacks to its share. A
// tenant alone uses the whole limit.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/fair_queue.h"

namespace orthoserve {

class FairSlots {
 public:
  // How long a refused tenant keeps its reserve after its last refusal: longer than a client's
  // retry backoff, short enough that a tenant which went away frees its share.
  static constexpr absl::Duration kFairShareMemory = absl::Seconds(5);

  // What the refusals say: `what` names the slots in plural ("streams", "unary calls"),
  // `limit_flag` and `cap_flag` the flags of `limit` and `cap`.
  struct Names {
    std::string what;
    std::string limit_flag;
    std::string cap_flag;
  };
  // Which rule refused a slot (Acquire's `refused_by`).
  enum class Refusal { kNone, kLimit, kCap, kFairShare };

  // `limit` slots in all; `cap` > 0: at most that many per tenant; `shares`: the weights
  // (--tenant-shares; a tenant not named weighs 1); `known`: the token file's tenants (repeats
  // allowed; none: no token file).
  FairSlots(int limit, int cap, FairShares shares, std::vector<std::string> known, Names names);

  // A slot for `tenant` at `now`: OK, or RESOURCE_EXHAUSTED naming the rule, the figures and the
  // flag, with *refused_by saying which rule (kLimit, kCap or kFairShare). A refusal by the limit
  // or the fair share makes the tenant waiting (a cap does not: others cannot help it).
  absl::Status Acquire(const std::string& tenant, absl::Time now, Refusal* refused_by);
  // Gives back a slot `tenant` held.
  void Release(const std::string& tenant);
  // Keeps `tenant` waiting as of `now`, as a refusal would (a tenant with queued waiters).
  void Touch(const std::string& tenant, absl::Time now) { refused_[tenant] = now; }

  int held() const { return held_; }
  int held(const std::string& tenant) const;
  int limit() const { return limit_; }
  double Weight(const std::string& tenant) const;

 private:
  // The rule's figures for a slot of `tenant` (after forgetting refusals older than
  // kFairShareMemory).
  struct Reserve {
    int for_others = 0;       // Kept slots plus what each waiting tenant lacks to its share.
    int waiting_tenants = 0;  // Other tenants refused within kFairShareMemory and under their share.
    int idle_tenants = 0;     // Known tenants without traffic that keep a slot (one each).
    int share = 0;            // `tenant`'s guaranteed share.
  };
  Reserve ReserveOf(const std::string& tenant, absl::Time now);

  const int limit_;
  const int cap_;
  const FairShares shares_;
  const std::vector<std::string> known_;  // Sorted, without repeats.
  const Names names_;
  int held_ = 0;
  absl::flat_hash_map<std::string, int> tenant_held_;
  absl::flat_hash_map<std::string, absl::Time> refused_;  // Last refusal, within kFairShareMemory.
};

}  // namespace orthoserve
