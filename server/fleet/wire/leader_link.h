// LeaderLink: where this rank finds an elected fleet coordinator (docs/architecture.md,
// "Elected coordinator"): the term, rank and fleet address etcd names, or this process's own
// seat when this rank leads. It hands out a LogSource and a Store that follow it: every call
// goes to the coordinator of the term in force when the call starts.
//
// Terms fence the members. A term only ever replaces a lower one. A log read that carries an
// epoch other than the term in force (this rank joined an earlier coordinator) is answered
// FAILED_PRECONDITION at once, so the executor joins the new coordinator without waiting for the
// old one to time out; a join whose coordinator answers for another epoch than the term is
// refused with UNAVAILABLE (a coordinator that is not, or no longer, the one etcd names). So a
// member takes entries from one term's coordinator only, and an old coordinator that resumes
// after its term ended can reach no member that has seen the new term. Before any leader is
// known every call is UNAVAILABLE. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/collective/store.h"
#include "server/fleet/logic/log_source.h"
#include "server/fleet/wire/fleet_service.h"
#include "server/fleet/wire/fleet_tls.h"

namespace orthoserve {

class LeaderLink {
 public:
  // `tls` (not owned, may be null) must outlive the link.
  explicit LeaderLink(const FleetTls* tls) : tls_(tls) {}

  // The coordinator of `term` is fleet rank `rank` at fleet address `address`, or `local` (this
  // process's seat for that term) when non-null. Ignored unless `term` is above the term in
  // force (or equal to it, to switch a remote target to this process's own seat). Rank -1 (or a
  // rank the fleet TLS has no member name for): no rank coordinates in `term`, and every call
  // is UNAVAILABLE until a later term.
  void Follow(int64_t term, int rank, const std::string& address, std::shared_ptr<const CoordinatorSeat> local);

  // The term in force (0: none yet).
  int64_t term() const;

  LogSource& log() { return log_; }
  std::shared_ptr<Store> store() { return store_; }

 private:
  struct Target;
  // UNAVAILABLE for a term without a coordinator (Target::none), else OK.
  static absl::Status Usable(const Target& target);
  class FollowingLog;
  class FollowingStore;

  // The term in force and where it is; shared with the store, which collective joins that
  // outlive a generation (and this link) may still hold.
  class Targets {
   public:
    // Puts `target` in force unless the rule above refuses it; returns the target it replaced.
    std::shared_ptr<const Target> Follow(std::shared_ptr<const Target> target) ABSL_LOCKS_EXCLUDED(mu_);
    // The target in force, or UNAVAILABLE when no coordinator is known yet.
    absl::StatusOr<std::shared_ptr<const Target>> Current() const ABSL_LOCKS_EXCLUDED(mu_);

   private:
    mutable absl::Mutex mu_;
    std::shared_ptr<const Target> target_ ABSL_GUARDED_BY(mu_);
  };

  const FleetTls* const tls_;
  const std::shared_ptr<Targets> targets_ = std::make_shared<Targets>();

  class FollowingLog final : public LogSource {
   public:
    explicit FollowingLog(std::shared_ptr<Targets> targets) : targets_(std::move(targets)) {}
    absl::StatusOr<Joined> Join(const Member& me) override;
    absl::Status Leave(int rank, uint64_t incarnation, uint64_t epoch) override;
    absl::Status Report(const ReadyReport& report) override;
    absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                       int fleet_rank, uint64_t incarnation) override;
    absl::StatusOr<std::vector<LogEntry>> Read(const ReaderState& reader, int64_t from,
                                               absl::Duration timeout) override;

   private:
    const std::shared_ptr<Targets> targets_;
  };
  class FollowingStore final : public Store {
   public:
    explicit FollowingStore(std::shared_ptr<Targets> targets) : targets_(std::move(targets)) {}
    absl::Status Set(absl::string_view key, absl::string_view value) override;
    absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
    absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
    absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

   private:
    const std::shared_ptr<Targets> targets_;
  };

  FollowingLog log_{targets_};
  std::shared_ptr<Store> store_ = std::make_shared<FollowingStore>(targets_);
};

}  // namespace orthoserve
