// CallFences: which calls still hold slices of regions, so that a client can learn when the
// server will never again read or write the slices a call of its named (docs/shared_memory.md,
// "Fences"). No gRPC; thread-safe.
//
// A call that names region slices carries an id its client drew (StepHeader.call_id,
// OrthogonalizeRequest.call_id). Every lease the server takes for such a call holds a Hold of
// (tenant, call id) for as long as the lease lives — through computing, writing the result,
// a batch of the fleet — and no longer. Fence(tenant, id) marks the call fenced, so that no Hold
// of it can be taken any more (a message of the call that arrives late is refused), and returns
// once every Hold of it has been released: from then on the server touches none of the call's
// slices. A client whose call failed, or that gave up on it, fences it before it uses the call's
// slices again.
//
// Fenced ids are remembered for Options::retention after their last Hold went (at most
// Options::max_fenced_per_tenant of a tenant; beyond, its oldest is forgotten), so that a call's
// message delayed that long is still refused. Ids are per tenant: one tenant cannot fence, or see,
// another's calls.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace orthoserve {

class CallFences {
 public:
  struct Options {
    absl::Duration retention = absl::Minutes(10);  // How long a fenced id is remembered after its last hold.
    int max_fenced_per_tenant = 4096;             // Fenced ids remembered per tenant.
    std::function<absl::Time()> now = [] { return absl::Now(); };  // The clock (tests inject one).
  };

 private:
  struct State;

 public:
  // One lease's part in its call: counted until destroyed (or moved from). Movable, not copyable;
  // may be released on any thread. An empty Hold (a call without an id) counts nothing.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept = default;
    Hold& operator=(Hold&& other) noexcept;
    ~Hold();
    void Release();

   private:
    friend class CallFences;
    Hold(std::shared_ptr<State> state, std::string key) : state_(std::move(state)), key_(std::move(key)) {}
    std::shared_ptr<State> state_;
    std::string key_;
  };

  explicit CallFences(Options options);
  CallFences(const CallFences&) = delete;
  CallFences& operator=(const CallFences&) = delete;

  // A hold of call `call` of `tenant`; an empty `call` gives an empty Hold (nothing to fence).
  // FAILED_PRECONDITION when the call was fenced.
  absl::StatusOr<Hold> Take(absl::string_view tenant, absl::string_view call) ABSL_LOCKS_EXCLUDED(state_->mu);

  // Fences call `call` of `tenant` (from now on Take refuses it) and waits until it holds nothing,
  // or until `deadline`. OK: the call holds no lease any more (at once for an id never seen, which
  // is remembered as fenced all the same). DEADLINE_EXCEEDED: holds remain at the deadline (the
  // call stays fenced; fencing again waits again). INVALID_ARGUMENT for an empty id.
  absl::Status Fence(absl::string_view tenant, absl::string_view call, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(state_->mu);

  // Holds of `call` of `tenant` now (tests, status).
  int64_t holds(absl::string_view tenant, absl::string_view call) const ABSL_LOCKS_EXCLUDED(state_->mu);
  // Fenced ids remembered, all tenants.
  int64_t fenced() const ABSL_LOCKS_EXCLUDED(state_->mu);

 private:
  struct Record {
    int64_t holds = 0;
    bool fenced = false;
    absl::Time idle_since = absl::InfinitePast();  // When a fenced record's last hold went.
  };
  struct State {
    explicit State(Options o) : options(std::move(o)) {}
    const Options options;
    mutable absl::Mutex mu;
    absl::CondVar released;  // Signalled when a fenced record's last hold goes.
    absl::flat_hash_map<std::string, Record> records ABSL_GUARDED_BY(mu);  // Key(tenant, call) -> record.
    // Each tenant's fenced keys, oldest fence first (entries of forgotten records are skipped).
    absl::flat_hash_map<std::string, std::deque<std::string>> fenced_order ABSL_GUARDED_BY(mu);
    int64_t fenced_count ABSL_GUARDED_BY(mu) = 0;
  };

  static std::string Key(absl::string_view tenant, absl::string_view call);
  static void ReleaseKey(State& state, const std::string& key) ABSL_LOCKS_EXCLUDED(state.mu);
  // Forgets `tenant`'s fenced records that are idle past the retention, and its oldest beyond the
  // per-tenant bound (idle ones only: a record with holds is never forgotten).
  static void PruneLocked(State& state, const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu);

  const std::shared_ptr<State> state_;
};

}  // namespace orthoserve
