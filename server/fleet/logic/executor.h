// Executor: one fleet rank's membership and its run of the coordinator's log.
//
// Two threads. The reader joins the coordinator (again whenever it restarted or dropped this
// rank), reads the log — which is also this rank's heartbeat and its report of the generations
// it formed or failed — and sends queued aborts. The applier runs the entries in log order: a
// membership entry that lists this rank makes it join that generation's collective group (the
// old one is closed first); a batch runs on the collective of its generation, with every member
// taking part, so every member makes the same collective calls in the same order; a failure
// entry fails its step. Trainer steps received here wait until their batch (or its failure)
// comes up.
//
// Failure handling. A batch of a generation this rank is not (or no longer) a member of fails
// with UNAVAILABLE (retryable); so does one whose collective breaks, after which this rank
// reports the generation failed and the coordinator forms the next. When the reader sees a
// membership entry that is not graceful (a rank lost or restarted, or a group broken), it aborts
// the collective in use, so a batch waiting on a dead or stopped peer ends now rather than at its
// timeout. When the
// coordinator restarts, drops this rank, or stays unreachable for `peer_timeout`, every waiting
// step fails with UNAVAILABLE and the collective is closed; the rank then serves lone clients
// locally (member() is false) until it is a member of a formed generation again.
//
// A step the coordinator divided into parts (coordinator.h, "Parts") runs one part per batch
// entry; its trainer ranks are resolved after the last part, as after a whole batch.
//
// Replays (coordinator.h): after a group step's batch ran, this rank keeps the steps it took part
// with (their inputs; and a copy of those of the previous member when that member ran several
// trainer ranks of the step, see CopyToNextMember) until the group's next step runs here or `cache_ttl` passes, and sends
// their reports with its next read (and again after joining a restarted coordinator, the cache
// surviving a reset); a replay entry takes the inputs of its cached trainer ranks
// from there (their results are computed again and dropped) and delivers results only to the
// retried ranks' steps.
//
// Every wait is bounded: log reads and control calls by their RPC deadlines, collective calls
// by the collective timeout, joining a collective by `formation_timeout` (and given up at once
// for a newer generation or at shutdown).
//
// Thread-safe. Callbacks run on the applier or reader thread (or on the caller's thread when
// Submit fails at once, or for the steps Shutdown fails); they must not block on the executor.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/collective/collective.h"
#include "server/distributed/batch.h"
#include "server/engine/backend.h"
#include "server/fleet/logic/group_step.h"
#include "server/fleet/logic/log_source.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

// The collective group of one generation, as this rank joins it.
struct CollectiveGroup {
  uint64_t epoch = 0;       // The coordinator's epoch.
  int64_t generation = 0;
  int index = 0;            // This rank's collective rank (position in the member list).
  int world = 1;            // Members.
  std::string prefix;       // Unique store prefix of the group: "<epoch>/gen-<generation>".
};

// Joins a group; returns by `deadline` (DEADLINE_EXCEEDED naming what is missing) or with the
// collective's error. May be called on a thread that is abandoned if a newer generation comes
// first, so it must own (or share) whatever it uses.
using CollectiveFactory =
    std::function<absl::StatusOr<std::unique_ptr<Collective>>(const CollectiveGroup& group, absl::Time deadline)>;

class Executor {
 public:
  struct Options {
    Member self;                        // This rank: rank, public address, incarnation.
    Backend* backend = nullptr;         // Not owned.
    LogSource* log = nullptr;           // Not owned.
    Metrics* metrics = nullptr;         // Optional, not owned.
    CollectiveFactory join_collective;  // Required.
    ExecuteOptions execute;
    absl::Duration peer_timeout = absl::Seconds(15);       // Coordinator unreachable this long: lost.
    absl::Duration formation_timeout = absl::Seconds(30);  // Bound on joining one generation's collective.
    // A step submitted while this rank is not a member of a formed generation (the fleet is
    // re-forming: a rank joined or left, the coordinator changed) waits up to this long for this
    // rank's next generation to form, and is reported to the coordinator then; UNAVAILABLE (as
    // at once when zero) if none forms in time (checked each reader round, so up to about a
    // poll or a join backoff later), or at once when the rank is leaving or shutting down. Its
    // trainer thus retries nothing during a re-formation, and its step starts when it can.
    absl::Duration formation_hold = absl::ZeroDuration();
    absl::Duration poll = absl::Milliseconds(250);         // Long-poll of the log (the heartbeat period).
    // Longest wait between two failed joins or reads (the wait doubles from 50 ms). An elected
    // coordinator answers "not the coordinator" for the moment between etcd naming it and it
    // taking its seat, so its followers retry sooner.
    absl::Duration max_backoff = absl::Seconds(1);
    absl::Duration cache_ttl = absl::Seconds(150);         // Keep a group's last steps this long (for replays).
    absl::Duration notice_ttl = absl::Seconds(60);         // How long the coordinator relies on a notice of them:
                                                           // only steps kept at least this much longer are noticed.
    // Called after each step entry of the log was applied (its batch ran, or failed, or did not
    // concern this rank), with its index, from the applier thread. Rank 0 tells its coordinator
    // (Coordinator::BatchRan). May be empty.
    std::function<void(int64_t index)> on_step_applied;
    // Called on the reader thread, outside the executor's lock, for each membership entry as soon
    // as it is read (before the applier gets to it): the new generation's members, and whether
    // the change was graceful (ranks joining, or leaving after their work; never the first
    // generation after this rank joined a coordinator). Fleet cancels the
    // lone matrices it forwarded to ranks that are gone. May be empty; must not block.
    std::function<void(const std::vector<Member>& members, bool graceful)> on_membership;
  };

  // What this rank knows of the fleet.
  struct View {
    uint64_t epoch = 0;           // The coordinator's, once joined.
    int64_t generation = 0;       // The last generation applied (0: none).
    std::vector<Member> members;  // That generation's members.
    bool member = false;          // This rank is one of them.
    bool formed = false;          // It joined the generation's collective, which is intact.
  };

  static absl::StatusOr<std::unique_ptr<Executor>> Create(const Options& options);
  ~Executor();  // Fails steps still waiting with UNAVAILABLE.

  // Registers this trainer rank's part of a step and reports it ready; `done` runs exactly once.
  // Sets step->submission before it returns. When this rank is not a member of a formed
  // generation, the step is held for `formation_hold` (see Options) and fails with UNAVAILABLE
  // if no generation forms in time (at once without a hold); UNAVAILABLE also when the
  // coordinator does not take the report.
  void Submit(std::shared_ptr<TrainerStep> step, StepCallback done) ABSL_LOCKS_EXCLUDED(mu_);

  // Submit would take a step now or hold it for a forming generation: false when this rank is
  // shutting down or leaving, or not formed and holding nothing (formation_hold zero).
  bool TakesSteps() const ABSL_LOCKS_EXCLUDED(mu_);

  // A trainer's stream failed: tells the coordinator (asynchronously, from the reader thread).
  void AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Steps submitted here and not yet resolved.
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);
  View view() const ABSL_LOCKS_EXCLUDED(mu_);

  // OK unless this rank is wedged: a batch did not end within a bound after its collective was
  // aborted, or the reader thread has not come round for a minute.
  absl::Status Liveness() const ABSL_LOCKS_EXCLUDED(mu_);

  // Graceful leave: asks the coordinator for a generation without this rank and runs the log
  // until that generation starts (so batches already planned with this rank still run here).
  // OK when left (or not a member); DEADLINE_EXCEEDED after `timeout`; the coordinator's error.
  absl::Status Leave(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // The coordinator may be somewhere else now (an elected coordinator changed): a reader backing
  // off after a failed join or read tries again at once.
  void CoordinatorMoved() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiting {
    std::shared_ptr<TrainerStep> step;
    StepCallback done;
  };
  // A step Submit holds until this rank's next generation forms (Options::formation_hold).
  struct Held {
    Waiting waiting;
    absl::Time until;
  };
  struct CachedBatch {
    GroupKey key;
    absl::Time at;
    std::vector<std::shared_ptr<TrainerStep>> steps;
    std::vector<uint64_t> digests;  // Every trainer rank's, as the batch carried them (LogEntry::digests).
  };
  // A divided step (LogEntry::more_parts) whose earlier parts ran here: their plan and results,
  // and its steps here, resolved after the last part.
  struct PartialStep {
    absl::Time start;
    bool complete = true;  // Every part from the first ran here, in order.
    BatchPlan plan;
    BatchResult result;
    std::vector<Waiting> steps;
  };
  // What ApplyStep claims for a step entry under mu_ (ClaimStep), for its later stages.
  struct ClaimedStep {
    std::vector<Waiting> mine;   // The planned submissions' steps: from waiting_, or a divided step's parts_ record.
    std::vector<Waiting> stale;  // Submissions here of the same trainer ranks, superseded by a retry.
    std::shared_ptr<Collective> collective;            // The formed generation's, as it was.
    bool usable = false;                               // Formed, in the generation the entry was planned in.
    std::vector<std::shared_ptr<TrainerStep>> cached;  // A replay's trainer steps kept here.
    // A divided step's record, taken out of parts_ while its part runs (OpenPartLocked) and put back
    // after a part before the last (AddPart): the applier owns it, so nothing frees it under it.
    std::optional<PartialStep> partial;
    absl::Time start;                // When the step began here (its first part), for rendezvous times.
    // Steps of `mine` whose shared-memory inputs changed while the step ran (OwnRegionInputs):
    // not kept for replays.
    std::vector<std::shared_ptr<TrainerStep>> changed;
  };
  struct PendingAbort {
    GroupKey key;
    int trainer_rank;
    absl::Status reason;
    uint64_t submission;
  };

  explicit Executor(const Options& options);
  void ReaderLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void ApplierLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Apply(const LogEntry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  void ApplyMembership(const LogEntry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs a step entry (a batch, a part of a divided step, a replay, or a failure) and resolves the
  // steps it concerns here; the sequence of the stages below.
  void ApplyStep(const LogEntry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Stage 1: takes the entry's steps from waiting_ (and a divided step's record), with what the
  // later stages need of the executor's state, in one hold of mu_.
  ClaimedStep ClaimStep(const LogEntry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the steps of the entry's submissions from waiting_ into `claimed` (planned or stale).
  void ClaimWaitingLocked(const LogEntry& entry, ClaimedStep& claimed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens or continues a divided step's parts_ record (a failure entry ends it) and moves the
  // steps waiting in it into `claimed.mine`.
  void OpenPartLocked(const LogEntry& entry, ClaimedStep& claimed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The trainer steps kept here that a replay entry takes its inputs from.
  std::vector<std::shared_ptr<TrainerStep>> CachedStepsLocked(const LogEntry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stage 2: resolves what does not run: a failure entry's steps, stale submissions, and a step
  // of a generation this rank does not hold. True when nothing is left to run.
  bool ResolveUnrunnable(const LogEntry& entry, ClaimedStep& claimed) ABSL_LOCKS_EXCLUDED(mu_);
  // Stage 3: the blocks of this rank's own steps (their outputs sized for the part's matrices).
  static std::vector<LocalBlock> OwnBlocks(const LogEntry& entry, std::vector<Waiting>& mine);
  // Stage 3, replays: adds the blocks of the cached steps, computed again into `scratch`.
  static void AddReplayBlocks(const LogEntry& entry, const std::vector<std::shared_ptr<TrainerStep>>& cached,
                              std::vector<std::vector<char>>& scratch, std::vector<LocalBlock>& local);
  // Stage 4: runs the entry's batch with every member, recording its metrics.
  absl::StatusOr<BatchResult> RunBatch(const LogEntry& entry, const std::vector<LocalBlock>& local,
                                       Collective& collective) ABSL_LOCKS_EXCLUDED(mu_);
  // Stage 5: adds a divided step's part to its record; true when more parts follow (the steps
  // then wait in the record).
  bool AddPart(const LogEntry& entry, const BatchResult& result, ClaimedStep& claimed) ABSL_LOCKS_EXCLUDED(mu_);
  // Stage 5, after a divided step's last part: the whole step's entry (in `whole`) and results
  // (in `result`), or why this rank cannot give them; otherwise `entry` itself.
  static const LogEntry& WholeStep(const LogEntry& entry, absl::StatusOr<BatchResult>& result,
                                   ClaimedStep& claimed, LogEntry& whole);
  // Stage 6, after the step ran: the inputs its trainer steps read in place from shared-memory
  // regions become their own (TakeRegionInputs), before any copy or keep reads them and before
  // their trainers are answered and may reuse the regions. Steps whose regions changed meanwhile
  // go to `claimed.changed`.
  static void OwnRegionInputs(const GroupKey& key, ClaimedStep& claimed);
  // Stage 6: CopyToNextMember for the step that ran; its error replaces `result`.
  std::vector<std::shared_ptr<TrainerStep>> CopyForReplay(const LogEntry& step_entry,
                                                          absl::StatusOr<BatchResult>& result,
                                                          const ClaimedStep& claimed) ABSL_LOCKS_EXCLUDED(mu_);
  // Stage 7: the step's outcome; on failure the generation is reported failed, on success the
  // steps are kept for replays (Keep).
  StepOutcome Outcome(const LogEntry& entry, absl::StatusOr<BatchResult>& result, ClaimedStep& claimed,
                      const std::vector<std::shared_ptr<TrainerStep>>& copies) ABSL_LOCKS_EXCLUDED(mu_);
  // Resolves every step of `steps` with `outcome`, its rendezvous time counted from `start`.
  static void Resolve(std::vector<Waiting>& steps, const StepOutcome& outcome, absl::Time start);
  // After a group's batch ran: every member that ran several of its trainer ranks sends their
  // inputs to the next member (one all-to-allv, only when some member ran several), so that a
  // replay still finds them if that member dies before all of those ranks have their results.
  // Returns the copies received here; the collective's error (results must then be withheld).
  absl::StatusOr<std::vector<std::shared_ptr<TrainerStep>>> CopyToNextMember(
      const LogEntry& entry, const BatchResult& result, const std::vector<std::shared_ptr<TrainerStep>>& here,
      Collective& collective);
  // Keeps the steps of a group's batch that ran here (for a replay: the step's own, those a
  // replay took from the cache, the copies of the previous member's) and queues their notice.
  // The steps hold their inputs themselves (TakeRegionInputs).
  void Keep(const LogEntry& entry, const std::vector<std::shared_ptr<TrainerStep>>& steps) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues the notices of what `batch` keeps here; the first carries the step's digests.
  void AdvertiseLocked(const CachedBatch& batch, const std::vector<std::shared_ptr<TrainerStep>>& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins `group` on a helper thread; gives up when `deadline` passes, a newer generation is
  // queued, or the executor resets or stops.
  absl::StatusOr<std::shared_ptr<Collective>> JoinCollective(const CollectiveGroup& group, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the collective, drops the queue and fails every waiting step with `reason`; the
  // applier forgets the generation. Called by the reader.
  void Reset(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(mu_);
  void SendAborts() ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the next notices of kept steps to send (a bounded part of advertise_) into `into`.
  void TakeNoticesLocked(std::vector<ReadyReport>& into) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member of the generation applied, with its collective joined and intact.
  bool FormedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return member_ && collective_ != nullptr && formed_generation_ == generation_;
  }
  // A retryable UNAVAILABLE "step <key>: <why>".
  static StepOutcome Unavailable(const GroupKey& key, absl::string_view why);
  // Resolves every step of `steps` with Unavailable(key, why).
  static void FailAll(absl::flat_hash_map<GroupKey, std::vector<Waiting>>& steps, absl::string_view why);
  // Moves the steps of every divided step into `into` and forgets the records (applier thread,
  // or after it stopped).
  void TakePartsLocked(absl::flat_hash_map<GroupKey, std::vector<Waiting>>& into) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ready report of a step submitted here.
  ReadyReport ReportOf(const TrainerStep& step) const;
  // Puts a submitted step among the waiting ones; returns its report (with this rank's epoch).
  ReadyReport ListLocked(Waiting waiting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a listed step's report to the coordinator; fails the step when it is not taken.
  void SendReport(const ReadyReport& report) ABSL_LOCKS_EXCLUDED(mu_);
  // Reports the held steps: this rank's generation just formed (applier thread).
  void ReleaseHeld() ABSL_LOCKS_EXCLUDED(mu_);
  // Fails the held steps whose hold has passed (reader thread).
  void ExpireHeld() ABSL_LOCKS_EXCLUDED(mu_);
  // Moves every held step into `into` (to fail them).
  void TakeHeldLocked(absl::flat_hash_map<GroupKey, std::vector<Waiting>>& into) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishMetricsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  // Signalled when the applier has work (queue_, reset_requested_), when left_ or stopping_ is
  // set, and when the generation changes.
  absl::CondVar cv_;
  // Reader state.
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_read_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_contact_ ABSL_GUARDED_BY(mu_);  // Last successful call to the coordinator.
  absl::Time last_refusal_log_ = absl::InfinitePast();  // Reader thread only: last "not joining" warning.
  bool lost_ ABSL_GUARDED_BY(mu_) = false;         // Reset for an unreachable coordinator, not yet back.
  bool moved_ ABSL_GUARDED_BY(mu_) = false;        // CoordinatorMoved since the last backoff.
  bool fresh_join_ ABSL_GUARDED_BY(mu_) = false;   // Joined; no membership entry read since.
  absl::Time reader_alive_ ABSL_GUARDED_BY(mu_);  // Last round of the reader loop.
  std::deque<PendingAbort> aborts_ ABSL_GUARDED_BY(mu_);
  // Applier state.
  std::deque<LogEntry> queue_ ABSL_GUARDED_BY(mu_);
  bool reset_requested_ ABSL_GUARDED_BY(mu_) = false;
  int64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int collective_rank_ ABSL_GUARDED_BY(mu_) = -1;  // This rank's position in the generation's members.
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);
  bool member_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Collective> collective_ ABSL_GUARDED_BY(mu_);  // The formed generation's group; null otherwise.
  int64_t formed_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time busy_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // The applier is running an entry.
  absl::Time aborted_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // The collective was aborted under it.
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  // Steps.
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);  // Submitted while not formed; not reported yet.
  // By group (step 0): its last batch's steps here.
  absl::flat_hash_map<GroupKey, CachedBatch> cache_ ABSL_GUARDED_BY(mu_);
  // Divided steps between their parts: a record is here only while no part of its step runs (the
  // applier takes it out into ClaimedStep::partial for each part and puts it back after a part
  // before the last). Cleared with each generation (its parts cannot run in the next one), at a
  // reset and at Shutdown, failing their steps; a record out in a running part is not here then,
  // and the applier fails its steps when it would put it back after Shutdown.
  absl::flat_hash_map<GroupKey, PartialStep> parts_ ABSL_GUARDED_BY(mu_);
  std::vector<ReadyReport> advertise_ ABSL_GUARDED_BY(mu_);  // Reports of steps kept since the last read.
  uint64_t next_submission_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
  std::thread applier_;
};

}  // namespace orthoserve
