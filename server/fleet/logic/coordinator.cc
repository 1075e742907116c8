// Implementation of server/fleet/logic/coordinator.h: the lock, the timer and the log, and the
// orchestration of its three parts (Membership, Rendezvous, BatchPacer).
#include "server/fleet/logic/coordinator.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/call_unlocked.h"
#include "common/fleet_change.h"
#include "common/logging.h"
#include "common/message_text.h"

namespace orthoserve {
uint64_t RandomNonZeroId() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) value = (static_cast<uint64_t>(device()) << 32) ^ device();
  return value;
}

std::string GroupKey::ToString() const {
  return absl::StrCat(BoundedText(tenant), "/", BoundedText(job), "/", BoundedText(group), "@", step);
}

std::string RunText(const std::string& run) {
  return run.empty() ? std::string("a client that sent no run id") : absl::StrCat("run \"", BoundedText(run), "\"");
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const Options& options) {
  if (options.fleet_world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fleet world = ", options.fleet_world, " must be >= 1"));
  }
  if (options.rendezvous_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--rendezvous-timeout must be positive");
  }
  if (options.peer_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--fleet-peer-timeout must be positive");
  }
  if (options.home_rank < 0 || options.home_rank >= options.fleet_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator home rank ", options.home_rank, " is out of range for --world = ", options.fleet_world));
  }
  return std::unique_ptr<Coordinator>(new Coordinator(options));
}

Coordinator::Coordinator(const Options& options)
    : options_(options),
      epoch_(options.epoch != 0 ? options.epoch : RandomNonZeroId()),
      membership_(Membership::Options{options.fleet_world, options.peer_timeout, options.reform_delay,
                                      options.quarantine_after, options.quarantine_window, options.quarantine_base,
                                      options.quarantine_max, options.home_rank}),
      rendezvous_(Rendezvous::Options{options.fleet_world, options.rendezvous_timeout, options.stall_warning,
                                      options.max_tenant_pending_steps}),
      pacer_(BatchPacer::Options{options.batch_window, options.part_time, options.shares}) {
  timer_ = std::thread([this] { TimerLoop(); });
  notifier_ = std::thread([this] { NotifyLoop(); });
}

Coordinator::~Coordinator() {
  Shutdown();
  if (timer_.joinable()) timer_.join();
  if (notifier_.joinable()) notifier_.join();
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  log_cv_.SignalAll();
  timer_cv_.SignalAll();
  notify_cv_.SignalAll();
}

size_t Coordinator::pending_steps() const {
  absl::MutexLock lock(&mu_);
  return rendezvous_.pending();
}

size_t Coordinator::queued_steps() const {
  absl::MutexLock lock(&mu_);
  return pacer_.queued();
}

Generation Coordinator::generation() const {
  absl::MutexLock lock(&mu_);
  return membership_.generation();
}

std::vector<int> Coordinator::quarantined() const {
  absl::MutexLock lock(&mu_);
  return membership_.Quarantined(absl::Now());
}

// ---------------------------------------------------------------------------------------------
// The log.

void Coordinator::AppendLocked(LogEntry entry) {
  if (!entry.membership() && entry.generation == 0) entry.generation = membership_.generation().number;
  VLOG("fleet", 1) << "log " << log_.end() << " gen " << entry.generation << " "
                   << (entry.membership() ? "membership" : entry.key.ToString()) << " " << entry.status
                   << (entry.part_offset > 0 || entry.more_parts
                           ? absl::StrCat(" part: matrices ", entry.part_offset, "..",
                                          entry.part_offset + static_cast<int64_t>(entry.plan.matrices.size()) - 1,
                                          entry.more_parts ? ", more follow" : ", the last")
                           : std::string());
  log_.Append(std::move(entry));
  log_cv_.SignalAll();
  if (!waiters_.empty()) notify_cv_.SignalAll();
}

void Coordinator::AppendFailureLocked(const GroupKey& key, absl::Status status, bool fleet_change,
                                      const char* failure) {
  LogEntry entry;
  entry.key = key;
  entry.status = fleet_change ? MarkFleetChange(std::move(status)) : std::move(status);
  entry.failure = failure;
  AppendLocked(std::move(entry));
}

absl::Status Coordinator::CheckEntrySizeLocked(const LogEntry& entry) const {
  if (options_.max_entry_bytes == 0) return absl::OkStatus();
  const size_t bound = LogEntryBytesBound(entry);
  if (bound <= options_.max_entry_bytes) return absl::OkStatus();
  size_t placements = 0;
  for (const MatrixPlan& m : entry.plan.matrices) placements += m.blocks.size();
  return absl::InvalidArgumentError(absl::StrCat(
      "step ", entry.key.ToString(), ": its plan (", entry.plan.matrices.size(), " matrices, ", placements,
      " block placements over ", entry.plan.trainer_world, " trainer ranks) could take up to ", bound,
      " bytes in the fleet's log, more than the ", options_.max_entry_bytes,
      " one log entry may hold; send fewer matrices per step or use fewer trainer ranks per group"));
}

void Coordinator::RefusedLocked(const char* cause) const {
  if (options_.on_refusal) options_.on_refusal(cause);
}

// ---------------------------------------------------------------------------------------------
// Membership.

absl::Status Coordinator::CheckIdentityLocked(int rank, uint64_t epoch, uint64_t incarnation) const {
  if (epoch != epoch_) {
    return absl::FailedPreconditionError("the fleet coordinator restarted since this rank joined; join again");
  }
  return membership_.CheckReader(rank, incarnation);
}

absl::StatusOr<int64_t> Coordinator::Join(const Member& member) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down; retry");
  ASSIGN_OR_RETURN(const Membership::Joined joined, membership_.Join(member, log_.end(), absl::Now()));
  if (joined.again) return joined.cursor;
  if (joined.restarted) {
    // Its previous process is gone: whatever it held is lost now, not at the next reform.
    ReformLocked("restarted", /*force=*/false);
  }
  ScheduleReformLocked(joined.restarted ? "restarted" : "joined", /*force=*/false);
  return joined.cursor;
}

absl::Status Coordinator::Leave(int rank, uint64_t incarnation, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  RETURN_IF_ERROR(CheckIdentityLocked(rank, epoch, incarnation));
  membership_.Leave(rank);
  ReformLocked("left", /*force=*/false);
  return absl::OkStatus();
}

void Coordinator::ScheduleReformLocked(const std::string& reason, bool force) {
  membership_.Schedule(reason, force, absl::Now());
  timer_cv_.SignalAll();
}

void Coordinator::ReformLocked(const std::string& reason, bool force) {
  const int64_t quarantines = membership_.quarantines();
  const absl::Time now = absl::Now();
  const bool reformed = membership_.Reform(reason, force, now);
  if (membership_.quarantines() != quarantines && options_.on_quarantine) {
    options_.on_quarantine(membership_.last_quarantined());  // At most one a reform.
  }
  if (!reformed) return;
  const Generation& generation = membership_.generation();
  if (!generation.members.empty()) {
    LogEntry entry;
    entry.generation = generation.number;
    entry.members = generation.members;
    // Ranks joining (or taken back from quarantine), or leaving after their work: batches in
    // flight on the old collective are left to finish.
    entry.graceful = reason == "left" || reason == "joined" || reason == "released";
    AppendLocked(std::move(entry));
  }
  StepDecisions decisions;
  rendezvous_.Reformed(membership_, decisions);
  ApplyLocked(decisions);
  // The new generation is not formed yet, so nothing is paced: queued steps go into the log now
  // (placed on the new members), and batches of the old generation hold nothing back.
  pacer_.Reformed();
  ReleaseLocked();
  if (options_.on_generation) options_.on_generation(membership_.generation(), reason);
}

// ---------------------------------------------------------------------------------------------
// Steps.

absl::Status Coordinator::Report(ReadyReport report) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down; retry");
  if (report.epoch != epoch_) {
    return absl::FailedPreconditionError("the fleet coordinator restarted since this rank joined; join again");
  }
  if (!membership_.IsMember(report.fleet_rank, report.incarnation)) {
    return absl::UnavailableError(absl::StrCat("fleet rank ", report.fleet_rank, " is not a member of generation ",
                                               membership_.generation().number,
                                               " of the fleet; retry on a ready member"));
  }
  const size_t pending = rendezvous_.pending();
  StepDecisions decisions;
  rendezvous_.Report(std::move(report), membership_, decisions);
  if (rendezvous_.pending() > pending) timer_cv_.SignalAll();  // A new step: its deadline may be the next.
  ApplyLocked(decisions);
  return absl::OkStatus();
}

absl::Status Coordinator::Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                                int fleet_rank, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  if (!membership_.IsMember(fleet_rank, incarnation)) {
    return absl::FailedPreconditionError(absl::StrCat("fleet rank ", fleet_rank, " (incarnation ", incarnation,
                                                      ") is not a member of generation ",
                                                      membership_.generation().number, ": its abort of step ",
                                                      key.ToString(), " is ignored"));
  }
  StepDecisions decisions;
  RETURN_IF_ERROR(rendezvous_.Abort(key, trainer_rank, reason, submission, fleet_rank, decisions));
  for (const StepDecision& d : decisions) {
    // The parts still to come: the failure ends the step on every member.
    if (d.kind == StepDecision::Kind::kFailed) pacer_.Forget(key);
  }
  ApplyLocked(decisions);
  return absl::OkStatus();
}

void Coordinator::ApplyLocked(StepDecisions& decisions) {
  for (StepDecision& d : decisions) {
    switch (d.kind) {
      case StepDecision::Kind::kComplete:
        CompleteLocked(d.key, d.replay);
        break;
      case StepDecision::Kind::kWithdrawn:
        pacer_.Unqueue(d.key);
        break;
      case StepDecision::Kind::kFailed:
        if (d.refused) RefusedLocked(d.reason);
        // The mark of a fleet change is in the status already.
        AppendFailureLocked(d.key, std::move(d.status), /*fleet_change=*/false, d.reason);
        if (d.reason == kStepFailureTimeout && options_.on_rendezvous_timeout) options_.on_rendezvous_timeout();
        break;
    }
  }
}

bool Coordinator::PacingLocked() const { return pacer_.Pacing(membership_.HomeRankRunsEveryBatch()); }

void Coordinator::CompleteLocked(const GroupKey& key, bool replay) {
  const std::vector<MatrixPlan>* specs = rendezvous_.specs(key);
  if (specs == nullptr) return;  // Taken already, or not complete any more.
  if (!PacingLocked()) {
    AppendStepLocked(key, specs->size(), {});
    return;
  }
  if (!pacer_.Queue(key, *specs, replay, static_cast<int>(membership_.generation().members.size()))) return;
  ReleaseLocked();
}

void Coordinator::AppendStepLocked(const GroupKey& key, size_t part_end, std::vector<double> costs) {
  const std::vector<MatrixPlan>* specs = rendezvous_.specs(key);
  if (specs == nullptr) return;  // Taken already, or not complete any more.
  // Each matrix is estimated once per step (a wire plan's estimate checks it): owners, pacing and
  // parts share these.
  if (costs.size() != specs->size()) costs = MatrixCosts(*specs);
  std::optional<absl::StatusOr<LogEntry>> batch = rendezvous_.Take(key, membership_.generation(), costs);
  if (!batch.has_value()) return;
  if (!batch->ok()) {
    AppendFailureLocked(key, batch->status(), false, kStepFailureInvalid);
    return;
  }
  LogEntry& entry = **batch;
  if (absl::Status size = CheckEntrySizeLocked(entry); !size.ok()) {
    RefusedLocked(kStepFailureLimit);
    AppendFailureLocked(key, std::move(size), false, kStepFailureLimit);
    return;
  }
  // A divided step of the same key still running (a retry completed before its parts did) ends
  // first, in one last part.
  if (pacer_.divided(key)) AppendPartLocked(key, /*rest=*/true);
  if (part_end == 0 || part_end >= entry.plan.matrices.size() || !PacingLocked()) {
    double cost = 0;
    for (double c : costs) cost += c;
    AppendLocked(std::move(entry));
    pacer_.Appended(log_.end() - 1, cost, absl::Now());
    return;
  }
  entry.generation = membership_.generation().number;
  pacer_.Divide(std::move(entry), part_end, std::move(costs));
  AppendPartLocked(key, /*rest=*/false);
}

void Coordinator::AppendPartLocked(const GroupKey& key, bool rest) {
  std::optional<BatchPacer::Part> part =
      pacer_.NextPart(key, rest, PacingLocked(), membership_.generation().number);
  if (!part.has_value()) return;
  AppendLocked(std::move(part->entry));
  pacer_.Appended(log_.end() - 1, part->cost, absl::Now());
}

void Coordinator::ReleaseLocked() {
  while (std::optional<BatchPacer::Turn> turn = pacer_.Next(PacingLocked())) {
    if (turn->part) {
      AppendPartLocked(turn->key, /*rest=*/false);
    } else if (rendezvous_.complete(turn->key)) {
      AppendStepLocked(turn->key, turn->part_end, std::move(turn->costs));
    }
  }
}

void Coordinator::BatchRan(int64_t index) {
  absl::MutexLock lock(&mu_);
  pacer_.Ran(index, absl::Now());
  ReleaseLocked();
}

// ---------------------------------------------------------------------------------------------
// Readers and the timer.

absl::Status Coordinator::ReadBeginLocked(const ReaderState& reader, int64_t from) {
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  RETURN_IF_ERROR(CheckIdentityLocked(reader.rank, reader.epoch, reader.incarnation));
  for (const ReadyReport& kept : reader.kept) {
    StepDecisions decisions;
    rendezvous_.Keep(kept, reader.rank, reader.incarnation, membership_, decisions);
    ApplyLocked(decisions);
  }
  if (membership_.Hear(reader, from, absl::Now()) == Membership::Heard::kFailed) {
    ScheduleReformLocked("collective_failed", /*force=*/true);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LogEntry>> Coordinator::Read(const ReaderState& reader, int64_t from,
                                                        absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ReadBeginLocked(reader, from));
  const absl::Time deadline = absl::Now() + timeout;
  while (!shutdown_ && log_.end() <= from) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    log_cv_.WaitWithTimeout(&mu_, left + absl::Milliseconds(1));  // The loop rechecks, timed out or not.
  }
  ASSIGN_OR_RETURN(std::vector<SharedLogEntry> shared, ReadEndLocked(reader, from));
  std::vector<LogEntry> out;  // This reader's own copies (in process: rank 0's, and tests').
  out.reserve(shared.size());
  for (const SharedLogEntry& e : shared) out.push_back(*e);
  return out;
}

void Coordinator::ReadAsync(const ReaderState& reader, int64_t from, absl::Duration timeout, ReadDone done) {
  absl::StatusOr<std::vector<SharedLogEntry>> now;
  {
    absl::MutexLock lock(&mu_);
    absl::Status begun = ReadBeginLocked(reader, from);
    if (begun.ok() && log_.end() <= from && timeout > absl::ZeroDuration()) {
      Waiter waiter{reader, from, absl::Now() + timeout, std::move(done)};
      waiter.reader.kept.clear();  // Taken in: not held again while it waits.
      waiters_.push_back(std::move(waiter));
      notify_cv_.SignalAll();  // Its deadline may be the next.
      return;
    }
    now = begun.ok() ? ReadEndLocked(reader, from) : absl::StatusOr<std::vector<SharedLogEntry>>(begun);
  }
  done(std::move(now));
}

void Coordinator::NotifyLoop() {
  std::vector<std::function<void()>> ready;
  mu_.Lock();
  for (;;) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (shutdown_ || log_.end() > it->from || now >= it->deadline) {
        ready.push_back([done = std::move(it->done), read = ReadEndLocked(it->reader, it->from)]() mutable {
          done(std::move(read));
        });
        it = waiters_.erase(it);
      } else {
        next = std::min(next, it->deadline);
        ++it;
      }
    }
    if (!ready.empty()) {
      CallUnlocked(mu_, ready);
      continue;  // More may have come meanwhile.
    }
    if (shutdown_) break;
    notify_cv_.WaitWithDeadline(&mu_, next);  // Either way: go round.
  }
  mu_.Unlock();
}

absl::StatusOr<std::vector<SharedLogEntry>> Coordinator::ReadEndLocked(const ReaderState& reader, int64_t from) {
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  // It may have been dropped while waiting (silent for too long, or replaced).
  RETURN_IF_ERROR(CheckIdentityLocked(reader.rank, reader.epoch, reader.incarnation));
  membership_.Seen(reader.rank, absl::Now());
  std::vector<SharedLogEntry> out = log_.From(from);
  // Drop what every joined rank has read.
  log_.DropBefore(membership_.OldestCursor(log_.end()));
  return out;
}

void Coordinator::Listed(const absl::flat_hash_map<int, uint64_t>& listed) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  if (membership_.CheckListed(listed)) ReformLocked("lost", /*force=*/false);
}

void Coordinator::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Milliseconds(250);
    if (membership_.CheckLiveness(now)) ReformLocked("lost", /*force=*/false);
    if (membership_.QuarantineOver(now)) ReformLocked("released", /*force=*/false);
    if (now >= membership_.reform_at()) {
      const auto [reason, forced] = membership_.TakeScheduled();
      ReformLocked(reason, forced);
    } else {
      next = std::min(next, membership_.reform_at());
    }
    StepDecisions expired;
    rendezvous_.Expire(now, membership_.generation().number, next, expired);
    ApplyLocked(expired);
    // A batch rank 0 has not reported as run within the rendezvous timeout (its executor is
    // stuck or gone) no longer holds the queue back.
    if (pacer_.DropStalled(now, options_.rendezvous_timeout)) ReleaseLocked();
    rendezvous_.Sweep(now);
    timer_cv_.WaitWithTimeout(&mu_, std::max(next - absl::Now(), absl::Milliseconds(1)));  // Either way: go round.
  }
}

}  // namespace orthoserve
