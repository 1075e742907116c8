// The coordinator of a fleet (runs on fleet rank 0): it decides the fleet's membership, one
// generation after another, collects ready reports of trainer ranks and appends one totally
// ordered log that every member executes in order, as Horovod's controller does (docs/architecture.md).
// Pure C++: the fleet service carries its calls between processes.
//
// Membership. A rank process joins with its rank and a random incarnation; the coordinator
// answers with its own random epoch. Members heartbeat by reading the log. The coordinator
// starts a new generation (a membership entry in the log: the members, member i being
// collective rank i) whenever a rank joins (after `reform_delay`, so that ranks starting
// together form one generation), leaves gracefully, restarts (a new incarnation of a member),
// is silent for `peer_timeout`, or reports that it could not join or lost the generation's
// collective. Steps reported by ranks that drop out are withdrawn (their trainers retry
// elsewhere); batches already in the log run or fail on the members of their generation.
//
// Replays. A group step can run on every rank and still lose one trainer rank's result: the
// fleet rank that streamed to it died before sending it. The other trainers have moved on, so a
// retry of that rank alone could never meet them again. Members therefore keep the inputs of
// the last step of each group they ran (Executor; a member that ran several trainer ranks of a
// step also leaves a copy with the next member) and send its reports with their next read (and
// again to a restarted coordinator). A retried report (attempt > 0) of a step that members keep
// starts a replay: the trainer ranks whose inputs a member holds are filled in from there
// ("cached"), retries fill the rest, and the batch runs again with the same specs (the same
// bits), results going to the retried ranks only. A retry of a step older than the group's last
// kept one fails at once with ABORTED. Kept steps are the run's own (the group key carries the
// run): another run's retry of the same step number never finds them and gathers its own ranks.
// And a retry is answered from the kept inputs only with the blocks the original sent: its report's
// digest (ReadyReport::digest, of every block's bytes) must equal that of the kept original of its
// trainer rank, or the replay fails with ABORTED ("digest_mismatch") — the other ranks' kept
// blocks were combined with the original's, so a result from different blocks would be no step's.
//
// Runs. Every step key carries the trainers' run (GroupKey::run, the client's StepHeader.run_id).
// Reports of two runs are never put into one step: while a step's ranks of one run gather, a
// report of another run for the same (tenant, job, group, step) is refused — its step fails with
// FAILED_PRECONDITION naming the step and both runs ("run_mismatch") — and the first run's step
// goes on. An old client's run "" is a run like any other here.
//
// Limits. A tenant has at most `max_tenant_pending_steps` steps gathering at once (a report that
// would open one more fails its step with RESOURCE_EXHAUSTED, "limit"); a pending step holds
// memory for the reports that arrived, not for the world they claim; a batch whose log entry would
// exceed `max_entry_bytes` fails with INVALID_ARGUMENT ("limit") instead of being appended, so no
// entry is ever too large for a member to read.
//
// Steps. A fleet rank reports a trainer rank ready once it holds all of that trainer's blocks
// for a (group, step). When all W trainer ranks of the step have reported, the coordinator
// checks that they agree (same world, no duplicate rank, the same spec list — INVALID_ARGUMENT
// naming the first difference otherwise), builds the BatchPlan (placements on collective ranks
// of the current generation, AUTO owners) and appends it. A report with a higher attempt
// replaces its trainer rank's earlier one (a client retry); an equal or lower one is a
// duplicate rank. A step whose ranks do not all arrive within the rendezvous timeout is
// appended as ABORTED naming the missing trainer ranks (retryable when the membership changed
// while it waited); an explicit Abort with a retryable reason (UNAVAILABLE) withdraws that
// trainer's report, any other reason aborts the step as ABORTED naming the rank and reason.
//
// Order of batches. Members run the log's batches one at a time, in log order. With
// `batch_window` > 0 the coordinator does not append a complete step at once: complete steps
// wait in a fair queue (common/fair_queue.h: weighted fair between tenants, by `shares`, then
// between a tenant's jobs, each batch costing its matrices' estimated FLOPs) and are appended
// when fewer than `batch_window` appended batches have not yet run on rank 0 (BatchRan, from
// rank 0's executor, which takes part in every batch while it is a member; "rank 0" is
// `home_rank`, the rank in the coordinator's own process, throughout). So a small job's
// step waits behind at most `batch_window` batches of a flood, not behind the whole flood; the
// batches themselves, and so every result, are unchanged. Without rank 0 in the generation (or
// with batch_window = 0) steps are appended as they complete.
//
// Parts. While pacing, a step of several matrices is appended in parts (`part_time` > 0): each a
// run of consecutive matrices of about `part_time` of work, as estimated from the FLOPs per second
// of the batches rank 0 has run, and at least one matrix per member (so that no member idles; the
// first part of a fleet's first step is just that). After each part the rest of the step is
// queued again, charged that part's cost, ahead of its job's later steps (FairQueue::PushFront),
// so another tenant's or job's step runs between the parts of a large one while a job's own
// steps keep their order. Every part is cut from the step's one checked plan (placements, algorithms, options);
// AUTO owners are chosen per part, to balance the part that runs. No result changes: a matrix's
// bits do not depend on which member computes it or on the other matrices of its batch (batch.h).
// Members resolve the step's trainer ranks after its last part (LogEntry::more_parts).
// Replays are never divided. If the generation changes between parts, the rest is appended at
// once as its last part of the old generation, which members fail as retryable.
//
// Structure. The coordinator is one lock, a timer thread and the log (OrderedLog); its three
// parts are plain classes under that lock, each in its own file: Membership (membership.h: rank
// processes and generations), Rendezvous (rendezvous.h: pending steps, runs, replays, limits) and
// BatchPacer (batch_pacer.h: the order of batches, and parts). No part calls another: the
// rendezvous hands back what it decided about a step (StepDecisions) and the coordinator carries
// it out, in the log and in the order of batches. None of them knows which rank it runs on.
// Thread-safe.
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
#include "common/fair_queue.h"
#include "common/status.h"
#include "server/fleet/logic/batch_pacer.h"
#include "server/fleet/logic/fleet_log.h"
#include "server/fleet/logic/group_step.h"
#include "server/fleet/logic/membership.h"
#include "server/fleet/logic/ordered_log.h"
#include "server/fleet/logic/rendezvous.h"

namespace orthoserve {

class Coordinator {
 public:
  struct Options {
    int fleet_world = 1;                                    // S: ranks are 0..S-1.
    // The coordinator's epoch: every member's calls must carry it, and it names the collective
    // groups of its generations. 0: a random one (a static coordinator); an elected one uses its
    // leadership term, so that members follow one term at a time (fleet.h, "Elected coordinator").
    uint64_t epoch = 0;
    // The fleet rank whose executor runs in this process and reports each batch it ran
    // (BatchRan): rank 0 for a static fleet, the elected rank otherwise.
    int home_rank = 0;
    absl::Duration rendezvous_timeout = absl::Seconds(60);  // From a step's first report.
    absl::Duration stall_warning = absl::Seconds(60);       // Log the missing ranks once after this.
    absl::Duration peer_timeout = absl::Seconds(15);        // A member silent this long is lost.
    absl::Duration reform_delay = absl::Milliseconds(200);  // Joins within this time form one generation.
    std::function<void()> on_rendezvous_timeout;            // Metrics hook; may be empty.
    // Called when a generation starts, under the coordinator's lock (it must not call back
    // into the coordinator); `reason` is one of joined, restarted, left, lost,
    // collective_failed, released (a rank's quarantine ended). May be empty.
    std::function<void(const Generation&, const std::string& reason)> on_generation;
    // Quarantine of a rank that keeps failing to join the collective (membership.h,
    // "Quarantine"): failures within the window that make it a candidate (0: never), the window,
    // and the backoff's first and largest length.
    int quarantine_after = 3;
    absl::Duration quarantine_window = absl::Seconds(60);
    absl::Duration quarantine_base = absl::Seconds(10);
    absl::Duration quarantine_max = absl::Minutes(5);
    // Called under the coordinator's lock when a rank goes into quarantine. May be empty.
    std::function<void(int rank)> on_quarantine;
    // Called, under the coordinator's lock, for each refusal that keeps answers their callers'
    // own or metadata bounded; `cause` is run_mismatch, digest_mismatch or limit
    // (Metrics::IntegrityRefused). May be empty.
    std::function<void(const char* cause)> on_refusal;
    // Batches appended but not yet run on rank 0 at most (0: no pacing; see "Order of batches").
    int batch_window = 0;
    FairShares shares;  // Tenants' weights and priority classes in the order of batches.
    // While pacing, steps are appended in parts of about this much work (0: whole; see "Parts").
    absl::Duration part_time = absl::ZeroDuration();
    // Group steps of one tenant waiting for trainer ranks at once; a report that would open one
    // more fails its step with RESOURCE_EXHAUSTED (0: no limit).
    int max_tenant_pending_steps = 0;
    // Largest encoded log entry (the fleet channel's message limit, less room for framing): a
    // batch that would not fit fails its step with INVALID_ARGUMENT instead (0: no limit).
    size_t max_entry_bytes = 0;
  };

  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const Options& options);
  ~Coordinator();

  uint64_t epoch() const { return epoch_; }

  // Registers a rank process. Returns the log index it should read from (the membership entry
  // that includes it comes later). A new incarnation of a rank replaces the old one (which
  // counts as restarted). INVALID_ARGUMENT for a rank outside [0, S); UNAVAILABLE after
  // Shutdown.
  absl::StatusOr<int64_t> Join(const Member& member) ABSL_LOCKS_EXCLUDED(mu_);
  // A graceful leave: the next generation goes without the rank. FAILED_PRECONDITION for an
  // epoch or incarnation that is not current (nothing to leave).
  absl::Status Leave(int rank, uint64_t incarnation, uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  // OK when the report was accepted (its outcome comes through the log). UNAVAILABLE when the
  // reporting rank is not a member of the current generation or after Shutdown (the step can
  // be retried elsewhere); FAILED_PRECONDITION for another epoch (the rank must join again).
  absl::Status Report(ReadyReport report) ABSL_LOCKS_EXCLUDED(mu_);
  // Trainer rank `trainer_rank`'s call of step `key` failed with `reason` on fleet rank
  // `fleet_rank` (incarnation `incarnation`), the member sending this; `submission` identifies
  // the failed submission (0: it never reported). Accepted only from a member of the current
  // generation (FAILED_PRECONDITION otherwise: a rank that was dropped or replaced has had its
  // reports withdrawn already), and, when the step holds the report of `submission`, only from
  // the member that reported it (PERMISSION_DENIED otherwise). UNAVAILABLE after Shutdown.
  absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                     int fleet_rank, uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);

  // Entries with index >= `from`, waiting up to `timeout` for at least one; also the reader's
  // heartbeat and formation report. FAILED_PRECONDITION when the reader's epoch or incarnation
  // is not current (it must join again); UNAVAILABLE after Shutdown.
  absl::StatusOr<std::vector<LogEntry>> Read(const ReaderState& reader, int64_t from, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Read without a thread that waits: `done` runs exactly once, without the coordinator's lock,
  // with what Read would return — within this call when there is no need to wait (entries from
  // `from` exist, the reader is refused, the coordinator has shut down), otherwise on the
  // coordinator's one notifier thread when an entry is appended, the timeout passes or at
  // Shutdown. `done` must not block (the fleet service hands its encoding to a pool). The
  // entries are the log's own, shared: every reader of an entry holds the same one.
  using ReadDone = std::function<void(absl::StatusOr<std::vector<SharedLogEntry>>)>;
  void ReadAsync(const ReaderState& reader, int64_t from, absl::Duration timeout, ReadDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

  Generation generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ranks in quarantine now (membership.h, "Quarantine"), in rank order.
  std::vector<int> quarantined() const ABSL_LOCKS_EXCLUDED(mu_);
  // Rank 0's executor has applied log entry `index` (and every one before it): the batches up
  // to it have run there, or failed.
  void BatchRan(int64_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // The ranks etcd lists as alive (rank -> incarnation; an elected coordinator's fleet reads
  // them every few hundred ms): a member listed before and not now is lost at once
  // (Membership::CheckListed) and the next generation forms without it.
  void Listed(const absl::flat_hash_map<int, uint64_t>& listed) ABSL_LOCKS_EXCLUDED(mu_);

  // Steps waiting for trainer ranks or, complete, for their turn (for tests and metrics).
  size_t pending_steps() const ABSL_LOCKS_EXCLUDED(mu_);
  // Complete steps waiting for their turn in the fair order of batches.
  size_t queued_steps() const ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes readers (waiting ones get UNAVAILABLE), stops the timer and notifier threads; later
  // calls fail or are no-ops.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit Coordinator(const Options& options);
  // Appends `entry` to the log (a batch or failure without a generation gets the current one)
  // and wakes readers.
  void AppendLocked(LogEntry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `failure`: one of the kStepFailure* reasons; `fleet_change`: a fleet change caused it (the
  // status gets the mark of MarkFleetChange).
  void AppendFailureLocked(const GroupKey& key, absl::Status status, bool fleet_change, const char* failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Carries out what the rendezvous decided, in order.
  void ApplyLocked(StepDecisions& decisions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step whose every trainer rank arrived: appended now, or queued for its turn.
  void CompleteLocked(const GroupKey& key, bool replay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds and appends the batch (or its failure) of complete step `key`, whole or (`part_end`
  // short of its size, while pacing) as its first part; `costs`: its matrices' costs when known.
  void AppendStepLocked(const GroupKey& key, size_t part_end, std::vector<double> costs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the next part of divided step `key` (its whole rest when `rest`).
  void AppendPartLocked(const GroupKey& key, bool rest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends queued steps and parts while the window has room (all of them when not pacing).
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PacingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT when batch `entry` would not fit in one log read (Options::max_entry_bytes).
  absl::Status CheckEntrySizeLocked(const LogEntry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refusal (Options::on_refusal).
  void RefusedLocked(const char* cause) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates a reader's or leaver's identity: FAILED_PRECONDITION when it must join again.
  absl::Status CheckIdentityLocked(int rank, uint64_t epoch, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next generation now if the set of live ranks differs from the members (or
  // `force`): its membership entry, the withdrawal of pending reports of ranks that are not
  // members any more, replays filled from new members, and the queue released.
  void ReformLocked(const std::string& reason, bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reforms after `reform_delay` (joins and failures that come together make one generation).
  void ScheduleReformLocked(const std::string& reason, bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A read's first half: refusals, what the reader keeps, its heartbeat and formation report.
  absl::Status ReadBeginLocked(const ReaderState& reader, int64_t from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read's second half, after any wait: the entries from `from` (refusals again: the reader
  // may have been dropped meanwhile), and the log trimmed to what some reader still needs.
  absl::StatusOr<std::vector<SharedLogEntry>> ReadEndLocked(const ReaderState& reader, int64_t from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes waiting ReadAsync calls as entries come, deadlines pass or the coordinator shuts down.
  void NotifyLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const uint64_t epoch_;
  // Guards everything below but timer_ (the constructor's and destructor's).
  mutable absl::Mutex mu_;
  absl::CondVar log_cv_;    // Signalled when an entry is appended and at Shutdown (Read waits on it).
  absl::CondVar timer_cv_;  // Signalled when the timer's next deadline may be sooner, and at Shutdown.
  absl::CondVar notify_cv_;  // Signalled when an entry is appended, a reader waits, and at Shutdown.
  // The three parts, each a plain class under mu_: who the members are, where trainer ranks meet
  // (and replays), and the order in which complete steps and their parts go into the log.
  Membership membership_ ABSL_GUARDED_BY(mu_);
  Rendezvous rendezvous_ ABSL_GUARDED_BY(mu_);
  BatchPacer pacer_ ABSL_GUARDED_BY(mu_);
  OrderedLog log_ ABSL_GUARDED_BY(mu_);
  // ReadAsync calls waiting for an entry (NotifyLoop completes them).
  struct Waiter {
    ReaderState reader;  // `kept` already taken in.
    int64_t from = 0;
    absl::Time deadline;
    ReadDone done;
  };
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
  std::thread notifier_;
};

}  // namespace orthoserve
