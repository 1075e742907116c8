// Implementation of server/fleet/logic/executor.h: the reader and applier threads, membership and
// liveness. Steps (Submit, batches) are in executor_steps.cc.
#include "server/fleet/logic/executor.h"

#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fleet_change.h"
#include "common/logging.h"

namespace orthoserve {
namespace {

// A batch still running this long after its collective was aborted means the rank is wedged.
constexpr absl::Duration kAbortGrace = absl::Seconds(30);
// A reader loop round takes at most a log read or a control call (seconds); this means stuck.
constexpr absl::Duration kReaderStuck = absl::Seconds(60);

std::string Hex(uint64_t value) { return absl::StrCat(absl::Hex(value, absl::kZeroPad16)); }

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const Options& options) {
  if (options.backend == nullptr || options.log == nullptr || !options.join_collective) {
    return absl::InvalidArgumentError("Executor needs a backend, a log source and a collective factory");
  }
  if (options.peer_timeout <= absl::ZeroDuration() || options.formation_timeout <= absl::ZeroDuration() ||
      options.max_backoff <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("Executor timeouts must be positive");
  }
  return std::unique_ptr<Executor>(new Executor(options));
}

Executor::Executor(const Options& options) : options_(options) {
  // Submissions count up from a random base: unique within the process, and unlikely to meet
  // another process's (the coordinator compares them only within one step).
  next_submission_ = RandomNonZeroId();
  last_contact_ = absl::Now();
  reader_alive_ = absl::Now();
  reader_ = std::thread([this] { ReaderLoop(); });
  applier_ = std::thread([this] { ApplierLoop(); });
}

Executor::~Executor() {
  Shutdown();
  if (reader_.joinable()) reader_.join();
  if (applier_.joinable()) applier_.join();
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(waiting_);
    TakePartsLocked(left);
    TakeHeldLocked(left);
  }
  FailAll(left, "the server is shutting down");
}

StepOutcome Executor::Unavailable(const GroupKey& key, absl::string_view why) {
  StepOutcome outcome;
  outcome.status = MarkFleetChange(absl::UnavailableError(absl::StrCat("step ", key.ToString(), ": ", why)));
  return outcome;
}

void Executor::FailAll(absl::flat_hash_map<GroupKey, std::vector<Waiting>>& steps, absl::string_view why) {
  for (auto& [key, list] : steps) {
    for (Waiting& w : list) w.done(Unavailable(key, why));
  }
}

void Executor::TakePartsLocked(absl::flat_hash_map<GroupKey, std::vector<Waiting>>& into) {
  for (auto& [key, partial] : parts_) {
    std::vector<Waiting>& list = into[key];
    for (Waiting& w : partial.steps) list.push_back(std::move(w));
  }
  parts_.clear();
}

void Executor::Shutdown() {
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> left;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (collective_ != nullptr) collective_->Abort("the server is shutting down");
    cv_.SignalAll();
    // Steps waiting for their batch fail now (retried on other members), not when the executor
    // is destroyed at the end of the drain; a batch being applied fails its own.
    left.swap(waiting_);
    TakePartsLocked(left);
    TakeHeldLocked(left);
  }
  FailAll(left, "the server is shutting down");
}

size_t Executor::waiting() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, list] : waiting_) n += list.size();
  for (const auto& [key, partial] : parts_) n += partial.steps.size();
  return n + held_.size();
}

Executor::View Executor::view() const {
  absl::MutexLock lock(&mu_);
  View v;
  v.epoch = epoch_;
  v.generation = generation_;
  v.members = members_;
  v.member = member_;
  v.formed = FormedLocked();
  return v;
}

absl::Status Executor::Liveness() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (busy_since_ != absl::InfiniteFuture() && aborted_at_ != absl::InfiniteFuture() &&
      now - aborted_at_ > kAbortGrace) {
    return absl::UnavailableError(absl::StrCat("wedged: a batch has not ended ", absl::FormatDuration(now - aborted_at_),
                                               " after its collective was aborted"));
  }
  if (!stopping_ && now - reader_alive_ > kReaderStuck) {
    return absl::UnavailableError(
        absl::StrCat("wedged: the fleet log reader has not come round for ", absl::FormatDuration(now - reader_alive_)));
  }
  return absl::OkStatus();
}

void Executor::PublishMetricsLocked() {
  Metrics* m = options_.metrics;
  if (m == nullptr) return;
  const bool formed = FormedLocked();
  m->fleet_generation().Set(static_cast<double>(generation_));
  m->fleet_members_ready().Set(static_cast<double>(members_.size()));
  m->fleet_ready().Set(formed ? 1 : 0);
}

void Executor::Reset(const absl::Status& reason) {
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> failed;
  {
    absl::MutexLock lock(&mu_);
    queue_.clear();
    aborts_.clear();  // For steps of a membership that no longer exists.
    advertise_.clear();  // Sent again, to whichever coordinator this rank joins next.
    reset_requested_ = true;
    // No longer a member from here on (the applier closes the collective and clears the rest):
    // whoever learns of the reset through a failed step sees the rank outside the fleet.
    member_ = false;
    ++resets_;
    if (collective_ != nullptr) {
      collective_->Abort(reason.message());
      if (busy_since_ != absl::InfiniteFuture()) aborted_at_ = absl::Now();
    }
    failed.swap(waiting_);
    cv_.SignalAll();
  }
  LOG_WARNING("fleet") << "leaving the fleet's generation: " << reason;
  FailAll(failed, absl::StrCat(reason.message(), "; retry"));
}

void Executor::TakeNoticesLocked(std::vector<ReadyReport>& into) {
  // A read carries a bounded part of what is kept, so that its request stays far below the
  // fleet's message limit however many groups this rank keeps steps of (each report is one
  // trainer rank's spec list: at most --max-matrices-per-step bounded specs); the rest goes with
  // the next reads, a poll apart.
  constexpr size_t kMaxNotices = 16;
  constexpr size_t kMaxNoticeMatrices = size_t{1} << 16;
  size_t taken = 0;
  size_t matrices = 0;
  while (taken < advertise_.size() && taken < kMaxNotices &&
         (taken == 0 || matrices + advertise_[taken].sent.size() <= kMaxNoticeMatrices)) {
    matrices += advertise_[taken].sent.size();
    ++taken;
  }
  into.assign(std::make_move_iterator(advertise_.begin()),
              std::make_move_iterator(advertise_.begin() + static_cast<std::ptrdiff_t>(taken)));
  advertise_.erase(advertise_.begin(), advertise_.begin() + static_cast<std::ptrdiff_t>(taken));
}

void Executor::SendAborts() {
  for (;;) {
    PendingAbort a;
    {
      absl::MutexLock lock(&mu_);
      if (aborts_.empty() || !joined_) return;
      a = std::move(aborts_.front());
      aborts_.pop_front();
    }
    absl::Status sent = options_.log->Abort(a.key, a.trainer_rank, a.reason, a.submission, options_.self.rank,
                                            options_.self.incarnation);
    if (!sent.ok()) LOG_WARNING("fleet") << "could not report the abort of " << a.key.ToString() << ": " << sent;
  }
}

void Executor::CoordinatorMoved() {
  absl::MutexLock lock(&mu_);
  moved_ = true;
  cv_.SignalAll();
}

void Executor::AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission) {
  std::vector<Waiting> withdrawn;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    // A held step was never reported: it is dropped here, and the other ranks still learn of the abort.
    for (auto h = held_.begin(); h != held_.end();) {
      if (submission != 0 && h->waiting.step->submission == submission && h->waiting.step->key == key) {
        withdrawn.push_back(std::move(h->waiting));
        h = held_.erase(h);
      } else {
        ++h;
      }
    }
    aborts_.push_back(PendingAbort{key, trainer_rank, reason, submission});
    cv_.SignalAll();
  }
  for (Waiting& w : withdrawn) {
    StepOutcome outcome;
    outcome.status = reason;
    w.done(std::move(outcome));
  }
}

void Executor::ReaderLoop() {
  absl::Duration backoff = absl::Milliseconds(50);
  auto unreachable = [&](const absl::Status& status) {
    bool reset = false;
    absl::Duration quiet;
    {
      absl::MutexLock lock(&mu_);
      quiet = absl::Now() - last_contact_;
      if (quiet > options_.peer_timeout && !lost_) {
        lost_ = true;
        joined_ = false;
        reset = true;
      }
    }
    if (reset) {
      Reset(absl::UnavailableError(absl::StrCat("the fleet coordinator has been unreachable for ",
                                                absl::FormatDuration(quiet), " (", status.message(), ")")));
    }
    absl::MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + backoff;
    while (!stopping_ && !moved_) {
      if (cv_.WaitWithDeadline(&mu_, until)) break;  // True: timed out.
    }
    if (moved_) {
      moved_ = false;
      backoff = absl::Milliseconds(50);
    } else {
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  };
  for (;;) {
    bool joined;
    ReaderState state;
    ExpireHeld();
    {
      absl::MutexLock lock(&mu_);
      reader_alive_ = absl::Now();
      if (stopping_) return;
      joined = joined_;
      state = ReaderState{options_.self.rank, epoch_, options_.self.incarnation, formed_generation_,
                          failed_generation_, {}};
      if (joined) TakeNoticesLocked(state.kept);
    }
    if (!joined) {
      absl::StatusOr<LogSource::Joined> j = options_.log->Join(options_.self);
      if (!j.ok()) {
        if (absl::IsFailedPrecondition(j.status()) || absl::IsPermissionDenied(j.status())) {
          // A coordinator of another release (its protocol), or one that does not take this
          // rank's fleet certificate as this rank: not a passing fault, so it is said at once and
          // then once a minute while it lasts.
          const absl::Time now = absl::Now();
          if (now - last_refusal_log_ >= absl::Minutes(1)) {
            LOG_WARNING("fleet") << "not joining the fleet: " << j.status().message();
            last_refusal_log_ = now;
          }
        } else {
          VLOG("fleet", 1) << "joining the fleet coordinator: " << j.status();
        }
        unreachable(j.status());
        continue;
      }
      absl::MutexLock lock(&mu_);
      if (epoch_ != 0 && epoch_ != j->epoch) LOG_INFO("fleet") << "the fleet coordinator restarted";
      epoch_ = j->epoch;
      next_read_ = j->log_from;
      // Generations are numbered per coordinator epoch, and a rank that joins again has left
      // whatever it had: report nothing of the past.
      formed_generation_ = 0;
      failed_generation_ = 0;
      // What this rank keeps for replays may be what a restarted coordinator needs.
      advertise_.clear();
      const absl::Time now = absl::Now();
      for (const auto& [group, batch] : cache_) {
        // Only what stays here for as long as the coordinator may count on it.
        if (batch.at + options_.cache_ttl - now < options_.notice_ttl) continue;
        AdvertiseLocked(batch, batch.steps);
      }
      joined_ = true;
      lost_ = false;
      fresh_join_ = true;
      last_contact_ = absl::Now();
      backoff = absl::Milliseconds(50);
      LOG_INFO("fleet") << "joined the fleet coordinator (epoch " << Hex(epoch_) << ") as rank " << options_.self.rank;
      continue;
    }
    SendAborts();
    int64_t from;
    {
      absl::MutexLock lock(&mu_);
      from = next_read_;
    }
    absl::StatusOr<std::vector<LogEntry>> entries = options_.log->Read(state, from, options_.poll);
    if (!entries.ok()) {
      if (entries.status().code() == absl::StatusCode::kFailedPrecondition) {
        {
          absl::MutexLock lock(&mu_);
          joined_ = false;
        }
        Reset(absl::UnavailableError(absl::StrCat("this rank must join the fleet again: ", entries.status().message())));
        continue;
      }
      {
        // Say it again with the next read.
        absl::MutexLock lock(&mu_);
        advertise_.insert(advertise_.end(), state.kept.begin(), state.kept.end());
      }
      unreachable(entries.status());
      continue;
    }
    std::vector<std::pair<std::vector<Member>, bool>> seen;  // Membership entries read, for on_membership.
    {
      absl::MutexLock lock(&mu_);
      last_contact_ = absl::Now();
      backoff = absl::Milliseconds(50);
      for (LogEntry& entry : *entries) {
        if (entry.index < next_read_) continue;
        next_read_ = entry.index + 1;
        if (entry.membership() && !entry.graceful && collective_ != nullptr && entry.generation > generation_) {
          // A member of the generation in use is gone (or its group broke): end the batch that may
          // be waiting for it. A graceful change (ranks joining, or leaving after running every
          // batch before this entry) leaves batches in flight alone.
          collective_->Abort(absl::StrCat("generation ", entry.generation, " replaces generation ", generation_,
                                          " after a rank was lost or its group broke"));
          if (busy_since_ != absl::InfiniteFuture()) aborted_at_ = absl::Now();
        }
        if (entry.membership() && options_.on_membership) {
          // The first generation after a join (a new coordinator, or this rank dropped) follows
          // nothing this rank saw: whoever it leaves out is gone, however the change was made.
          seen.emplace_back(entry.members, entry.graceful && !fresh_join_);
        }
        if (entry.membership()) fresh_join_ = false;
        queue_.push_back(std::move(entry));
      }
      cv_.SignalAll();
    }
    for (const auto& [members, graceful] : seen) options_.on_membership(members, graceful);
  }
}

void Executor::ApplierLoop() {
  for (;;) {
    LogEntry entry;
    std::shared_ptr<Collective> closing;
    absl::flat_hash_map<GroupKey, std::vector<Waiting>> divided;  // Steps between parts at a reset.
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && !reset_requested_ && queue_.empty()) cv_.Wait(&mu_);
      if (stopping_) return;
      if (reset_requested_) {
        reset_requested_ = false;
        TakePartsLocked(divided);
        closing = std::move(collective_);
        generation_ = 0;
        members_.clear();
        member_ = false;
        if (leaving_) left_ = true;
        PublishMetricsLocked();
        cv_.SignalAll();
      } else {
        entry = std::move(queue_.front());
        queue_.pop_front();
        busy_since_ = absl::Now();
      }
    }
    FailAll(divided, "this rank left the fleet's generation before the step's last part ran; retry");
    if (closing != nullptr) {
      closing.reset();  // Closes the connections outside the lock.
      continue;
    }
    Apply(entry);
    if (!entry.membership() && options_.on_step_applied) options_.on_step_applied(entry.index);
    absl::MutexLock lock(&mu_);
    busy_since_ = absl::InfiniteFuture();
    aborted_at_ = absl::InfiniteFuture();
  }
}

void Executor::Apply(const LogEntry& entry) {
  if (entry.membership()) {
    ApplyMembership(entry);
  } else {
    ApplyStep(entry);
  }
}

void Executor::ApplyMembership(const LogEntry& entry) {
  int index = -1;
  for (size_t i = 0; i < entry.members.size(); ++i) {
    const Member& m = entry.members[i];
    if (m.rank == options_.self.rank && m.incarnation == options_.self.incarnation) index = static_cast<int>(i);
  }
  std::shared_ptr<Collective> closing;
  CollectiveGroup group;
  int64_t resets;
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> dropped, divided;
  {
    absl::MutexLock lock(&mu_);
    if (entry.generation <= generation_) return;  // Stale.
    // Outside the generation, this rank's reports were withdrawn: its waiting steps cannot run.
    if (index < 0) dropped.swap(waiting_);
    // Divided steps of the old generation: their remaining parts cannot run in this one.
    TakePartsLocked(divided);
    closing = std::move(collective_);
    generation_ = entry.generation;
    members_ = entry.members;
    member_ = index >= 0;
    collective_rank_ = index;
    resets = resets_;
    group = CollectiveGroup{epoch_, entry.generation, index, static_cast<int>(entry.members.size()),
                            absl::StrCat(Hex(epoch_), "/gen-", entry.generation)};
    if (!member_ && leaving_) left_ = true;
    PublishMetricsLocked();
    cv_.SignalAll();
  }
  closing.reset();
  FailAll(divided, absl::StrCat("generation ", entry.generation, " of the fleet began before the step's last part ran"));
  if (index < 0) {
    LOG_INFO("fleet") << "generation " << entry.generation << " goes on without this rank";
    FailAll(dropped, absl::StrCat("this rank is not in generation ", entry.generation, " of the fleet; retry"));
    return;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Collective>> joined = JoinCollective(group, start + options_.formation_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (generation_ != entry.generation || resets_ != resets) return;  // Overtaken meanwhile.
    if (!joined.ok()) {
      failed_generation_ = entry.generation;
      LOG_WARNING("fleet") << "could not join generation " << entry.generation << "'s collective: " << joined.status();
      PublishMetricsLocked();
      return;
    }
    collective_ = *std::move(joined);
    formed_generation_ = entry.generation;
    LOG_INFO("fleet") << "generation " << entry.generation << " formed here: collective rank " << index << " of "
                      << group.world << " (" << collective_->name() << ", "
                      << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))) << ")";
    PublishMetricsLocked();
  }
  ReleaseHeld();
}

absl::StatusOr<std::shared_ptr<Collective>> Executor::JoinCollective(const CollectiveGroup& group,
                                                                     absl::Time deadline) {
  // The join runs on its own thread so that it can be abandoned: a newer generation makes it
  // pointless (a member it waits for may be gone for good), and shutdown must not wait for it.
  using Result = absl::StatusOr<std::unique_ptr<Collective>>;
  auto promise = std::make_shared<std::promise<Result>>();
  std::future<Result> future = promise->get_future();
  std::thread([factory = options_.join_collective, group, deadline, promise] {
    promise->set_value(factory(group, deadline));
  }).detach();
  int64_t resets;
  {
    absl::MutexLock lock(&mu_);
    resets = resets_;
  }
  for (;;) {
    if (future.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) {
      Result result = future.get();
      if (!result.ok()) return result.status();
      return std::shared_ptr<Collective>(*std::move(result));
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("the server is shutting down");
    if (resets_ != resets) return absl::AbortedError("the rank left the fleet while joining");
    for (const LogEntry& queued : queue_) {
      if (queued.membership() && queued.generation > group.generation) {
        return absl::AbortedError(absl::StrCat("generation ", queued.generation, " came first"));
      }
    }
    if (absl::Now() > deadline + absl::Seconds(5)) {
      // The factory should have returned by its deadline; do not wait for it any longer.
      return absl::DeadlineExceededError(absl::StrCat("joining generation ", group.generation,
                                                      "'s collective did not finish by its deadline"));
    }
  }
}

absl::Status Executor::Leave(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t epoch;
  bool member;
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> held;
  {
    absl::MutexLock lock(&mu_);
    leaving_ = true;  // From now on steps go to other members (TakesSteps is false).
    TakeHeldLocked(held);
    member = joined_ && member_;
    left_ = false;
    epoch = epoch_;
  }
  FailAll(held, "this rank is leaving the fleet; retry on another member");
  if (!member) return absl::OkStatus();
  RETURN_IF_ERROR(options_.log->Leave(options_.self.rank, options_.self.incarnation, epoch));
  absl::MutexLock lock(&mu_);
  while (!left_ && !stopping_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // True: timed out.
  }
  if (!left_ && !stopping_) {
    return absl::DeadlineExceededError(
        absl::StrCat("the fleet did not start a generation without this rank within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
