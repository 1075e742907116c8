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
// rank 0's executor, which takes part in every batch while it is a member). So a small job's
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
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fair_queue.h"
#include "common/shape.h"
#include "common/status.h"
#include "server/plan/matrix_plan.h"
#include "server/fleet/logic/group_step.h"

namespace orthoserve {

// A random non-zero 64-bit id (coordinator epochs, rank incarnations, submission bases).
uint64_t RandomNonZeroId();

// One rank process of the fleet.
struct Member {
  int rank = 0;
  std::string address;       // Public HOST:PORT.
  uint64_t incarnation = 0;  // Random per process start.
  int fleet_port = 0;        // Its fleet address's port on the host of `address` (peer compute); 0: none.

  bool operator==(const Member& o) const {
    return rank == o.rank && incarnation == o.incarnation && address == o.address && fleet_port == o.fleet_port;
  }
};

// One trainer rank's readiness for a step: its specs and its blocks (one per matrix).
struct ReadyReport {
  GroupKey key;
  int trainer_rank = 0;
  int trainer_world = 1;
  int fleet_rank = 0;
  uint64_t submission = 0;   // Unique per submitted trainer step on its fleet rank.
  int attempt = 0;           // The client's attempt number.
  uint64_t epoch = 0;        // The coordinator epoch the fleet rank joined.
  uint64_t incarnation = 0;  // The reporting fleet rank's incarnation.
  uint64_t digest = 0;       // Of the trainer rank's blocks (TrainerStep::digest).
  // A notice of a kept step (ReaderState::kept) may carry every trainer rank's digest of the step
  // (LogEntry::digests); empty otherwise.
  std::vector<uint64_t> step_digests;
  std::vector<MatrixPlan> matrices;  // Placements empty.
  std::vector<Block> blocks;         // One per matrix.
};

// Why the coordinator failed a group step before it ran (LogEntry::failure; the `reason` label of
// orthoserve_steps_aborted_total on the ranks whose trainers waited for it):
//  - timeout: not every trainer rank arrived within the rendezvous timeout;
//  - cancelled: a trainer rank's client cancelled its call (or its deadline passed);
//  - aborted: a trainer rank's call failed otherwise, or it retried a step its group had already
//    run past (which cannot run again);
//  - invalid: the trainer ranks' reports disagree (world, duplicate rank, specs) or are out of range;
//  - run_mismatch: the report came from another run than the one whose ranks the step was
//    gathering (see "Runs");
//  - digest_mismatch: a retry's blocks differ from those of the attempt that ran (see "Replays");
//  - limit: over a metadata limit (the tenant's pending steps, or a plan too large for the log).
inline constexpr char kStepFailureTimeout[] = "timeout";
inline constexpr char kStepFailureCancelled[] = "cancelled";
inline constexpr char kStepFailureAborted[] = "aborted";
inline constexpr char kStepFailureInvalid[] = "invalid";
inline constexpr char kStepFailureRunMismatch[] = "run_mismatch";
inline constexpr char kStepFailureDigestMismatch[] = "digest_mismatch";
inline constexpr char kStepFailureLimit[] = "limit";

// One entry of the ordered log, of one of three kinds:
//  - membership (members non-empty): generation `generation` starts with these members,
//    members[i] being collective rank i;
//  - batch (status OK): run `plan` for `key` in `generation` (placements name collective
//    ranks); submissions[r] is trainer rank r's submission;
//  - failure (status not OK): step `key` fails on every rank; `status` carries the mark of
//    MarkFleetChange (common/fleet_change.h) when a fleet change caused it; `failure` says why (one of the kStepFailure* above).
struct LogEntry {
  int64_t index = 0;
  int64_t generation = 0;
  GroupKey key;
  absl::Status status;
  std::string failure;  // Failure entries: why the step failed (kStepFailure*); empty otherwise.
  BatchPlan plan;
  std::vector<uint64_t> submissions;
  std::vector<uint64_t> digests;  // Batch: each trainer rank's blocks' digest (ReadyReport::digest), in rank order.
  std::vector<bool> cached;  // Batch: trainer ranks whose inputs come from the members' caches (a replay).
  // Batch of a divided step (see "Parts" above): `plan` holds the step's matrices from index
  // `part_offset` of its spec list; `more_parts` when parts of it follow. 0 and false for a whole step.
  int64_t part_offset = 0;
  bool more_parts = false;
  std::vector<Member> members;
  // Membership: every member of the previous generation can still run its batches — the change
  // only adds ranks or drops ranks that left gracefully (they run every batch before this
  // entry) — so nothing in flight is to be aborted. False when a rank was lost or restarted, or
  // the previous generation's collective broke.
  bool graceful = false;

  bool membership() const { return !members.empty(); }
};

// What a reading rank says about itself with each read (its heartbeat).
struct ReaderState {
  int rank = 0;
  uint64_t epoch = 0;
  uint64_t incarnation = 0;
  int64_t formed_generation = 0;  // The last generation whose collective it joined.
  int64_t failed_generation = 0;  // The last generation whose collective it could not join or lost.
  std::vector<ReadyReport> kept;  // Reports of the steps it has kept since its last read (or join).
};

// The generation in force.
struct Generation {
  int64_t number = 0;           // 0: none yet.
  std::vector<Member> members;  // Collective rank order.
  bool formed = false;          // Every member has joined its collective.
};


class Coordinator {
 public:
  struct Options {
    int fleet_world = 1;                                    // S: ranks are 0..S-1.
    absl::Duration rendezvous_timeout = absl::Seconds(60);  // From a step's first report.
    absl::Duration stall_warning = absl::Seconds(60);       // Log the missing ranks once after this.
    absl::Duration peer_timeout = absl::Seconds(15);        // A member silent this long is lost.
    absl::Duration reform_delay = absl::Milliseconds(200);  // Joins within this time form one generation.
    std::function<void()> on_rendezvous_timeout;            // Metrics hook; may be empty.
    // Called when a generation starts, under the coordinator's lock (it must not call back
    // into the coordinator); `reason` is one of joined, restarted, left, lost,
    // collective_failed. May be empty.
    std::function<void(const Generation&, const std::string& reason)> on_generation;
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

  Generation generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // Rank 0's executor has applied log entry `index` (and every one before it): the batches up
  // to it have run there, or failed.
  void BatchRan(int64_t index) ABSL_LOCKS_EXCLUDED(mu_);

  // Steps waiting for trainer ranks or, complete, for their turn (for tests and metrics).
  size_t pending_steps() const ABSL_LOCKS_EXCLUDED(mu_);
  // Complete steps waiting for their turn in the fair order of batches.
  size_t queued_steps() const ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes readers and stops the timer thread; later calls fail or are no-ops.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // kLeaving: left gracefully, not a member, but still reads until it sees the generation
  // without it.
  enum class RankState { kAbsent, kJoining, kMember, kLeaving, kGone };
  struct Known {
    RankState state = RankState::kAbsent;
    Member member;
    absl::Time last_seen;
    int64_t cursor = 0;  // Next index it will read.
    int64_t formed_generation = 0;  // Last generation it reported joined.
    int64_t failed_generation = 0;  // Last generation it reported failed.
  };
  using SpecList = std::vector<MatrixPlan>;
  // A ready report as the coordinator holds it: its spec list apart, one list shared by every
  // report of a step that sent an identical one. W copies of one list were most of what the
  // coordinator held (315 MB for a pending step of 560 matrices over W = 1024 trainer ranks, and
  // as much again for the kept step; bench/results/plan_scale.md).
  struct Held {
    ReadyReport report;  // `matrices` empty: they are `*specs`.
    std::shared_ptr<const SpecList> specs;
  };
  // Holds `report`, sharing `shared`'s list when the report's own is identical in every field
  // (and dropping its own); `shared` becomes the report's list when it is null.
  static Held Hold(ReadyReport report, std::shared_ptr<const SpecList>& shared);
  struct Pending {
    absl::Time first_report;
    int64_t first_generation = 0;  // The generation at the first report.
    int trainer_world = 1;
    // The reports that arrived, by trainer rank: memory in proportion to the ranks that reported,
    // not to the world the first report claimed.
    absl::flat_hash_map<int, Held> reports;
    // The first spec list held, which the identical ones share.
    std::shared_ptr<const SpecList> specs;
    absl::flat_hash_set<int> cached;  // Replay: trainer ranks whose report is the original, its inputs in a member's cache.
    bool warned = false;
    bool queued = false;  // Complete, in ready_ (a withdrawal takes it out: not every rank has a report).
    size_t part_end = 0;  // Queued: the end of the first part it was charged for (0: whole).

    int arrived() const { return static_cast<int>(reports.size()); }
    bool complete() const { return arrived() == trainer_world; }
    // Trainer rank r's report; null when it has not arrived.
    const Held* report(int r) const {
      auto it = reports.find(r);
      return it == reports.end() ? nullptr : &it->second;
    }
  };
  // The last step of a group (key step = 0) that members keep: by trainer rank, the reports of
  // every member that keeps its inputs (the one it ran on, and a copy on the next member when
  // that rank ran several trainer ranks of the step).
  struct Kept {
    GroupKey key;
    absl::Time at;
    std::vector<std::vector<Held>> holders;
    std::shared_ptr<const SpecList> specs;  // As Pending::specs.
  };
  // A new pending step of `key` for trainer world `world` (the first report of it, or a replay's):
  // claims the step for key.run (see "Runs") and counts it for its tenant.
  Pending& NewPendingLocked(const GroupKey& key, int world) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets pending step `it`: its claim and its tenant's count go with it.
  void ErasePendingLocked(absl::flat_hash_map<GroupKey, Pending>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ErasePendingLocked(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION when another run's ranks are gathering the same step (see "Runs").
  absl::Status CheckRunLocked(const ReadyReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The digest of trainer rank `trainer_rank`'s blocks in step `key` as it ran: from the batch
  // appended for it, or from what members keep of it; nullopt when neither is known.
  std::optional<uint64_t> OriginalDigestLocked(const GroupKey& key, int trainer_rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTED when `report` retries a step that ran with blocks whose digest differs from its
  // original's (see "Replays"); OK when they agree or the step is not known to have run.
  absl::Status CheckRetryDigestLocked(const ReadyReport& report) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refusal (Options::on_refusal).
  void RefusedLocked(const char* cause) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT when batch `entry` would not fit in one log read (Options::max_entry_bytes).
  absl::Status CheckEntrySizeLocked(const LogEntry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A retried report of the step its group's members keep: starts the replay.
  void StartReplayLocked(ReadyReport report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills replay slots from what members keep; appends the batch when every slot is filled.
  void FillReplayLocked(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step whose every trainer rank arrived: appended now, or queued for its turn.
  void CompleteLocked(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds and appends the batch (or its failure) of complete step `key`.
  void AppendStepLocked(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends queued steps while the window has room (or all of them when not pacing).
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PacingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step in the fair order of batches: complete and not yet appended, or (`part`) the rest of
  // a divided one.
  struct Ready {
    GroupKey key;
    bool part = false;
  };
  // A divided step: its whole batch, and the part to append next: matrices [next, end).
  struct Divided {
    LogEntry batch;
    size_t next = 0;
    size_t end = 0;
  };
  // The end of the part of `matrices` that starts at `begin` (see "Parts"); matrices.size() when
  // not dividing.
  size_t PartEndLocked(const std::vector<MatrixPlan>& matrices, size_t begin, int members) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the next part of divided step `key` (its whole rest when `rest`) and queues what remains.
  void AppendPartLocked(const GroupKey& key, bool rest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  explicit Coordinator(const Options& options);
  void AppendLocked(LogEntry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `failure`: one of the kStepFailure* reasons; `fleet_change`: a fleet change caused it (the
  // status gets the mark of MarkFleetChange).
  void AppendFailureLocked(const GroupKey& key, absl::Status status, bool fleet_change, const char* failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<LogEntry> BuildBatchLocked(const GroupKey& key, Pending& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member of the current generation with this rank and incarnation.
  bool IsMemberLocked(int rank, uint64_t incarnation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates a reader's or leaver's identity: FAILED_PRECONDITION when it must join again.
  absl::Status CheckIdentityLocked(int rank, uint64_t epoch, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next generation now if the set of live ranks differs from the members (or
  // `force`), and withdraws pending reports of ranks that are not members any more.
  void ReformLocked(const std::string& reason, bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reforms after `reform_delay` (joins and failures that come together make one generation).
  void ScheduleReformLocked(const std::string& reason, bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WithdrawLocked(Pending& pending, int trainer_rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckLivenessLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckPendingLocked(absl::Time now, absl::Time& next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "r1, r2, ..." of the trainer ranks `p` still waits for (the first few, and how many more).
  static std::string MissingRanks(const Pending& p);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const uint64_t epoch_;
  // Guards everything below but timer_ (the constructor's and destructor's).
  mutable absl::Mutex mu_;
  absl::CondVar log_cv_;    // Signalled when an entry is appended and at Shutdown (Read waits on it).
  absl::CondVar timer_cv_;  // Signalled when the timer's next deadline may be sooner, and at Shutdown.
  std::vector<Known> known_ ABSL_GUARDED_BY(mu_);  // By rank.
  Generation generation_ ABSL_GUARDED_BY(mu_);
  absl::Time reform_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // A delayed reform (after joins).
  std::string reform_reason_ ABSL_GUARDED_BY(mu_);
  bool reform_forced_ ABSL_GUARDED_BY(mu_) = false;  // The next reform happens even with unchanged members.
  absl::flat_hash_map<GroupKey, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // By GroupKey::AnyRun(): the run whose ranks the pending step of that key gathers (see "Runs").
  absl::flat_hash_map<GroupKey, std::string> claims_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> tenant_pending_ ABSL_GUARDED_BY(mu_);  // Pending steps by tenant.
  absl::flat_hash_map<GroupKey, Kept> kept_ ABSL_GUARDED_BY(mu_);  // By GroupKey::Group().
  // The last step of a group appended as a batch: each trainer rank's digest (ReadyReport::digest),
  // what its retries are compared with. By GroupKey::Group().
  struct Ran {
    GroupKey key;
    absl::Time at;
    std::vector<uint64_t> digests;
  };
  absl::flat_hash_map<GroupKey, Ran> ran_ ABSL_GUARDED_BY(mu_);
  // Complete steps and parts for their turn; stale keys are skipped.
  FairQueue<Ready> ready_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<GroupKey, Divided> divided_ ABSL_GUARDED_BY(mu_);
  // Appended batches not yet run on rank 0: their index, when appended, their estimated cost.
  struct Unran {
    int64_t index = 0;
    absl::Time at;
    double cost = 0;
  };
  std::deque<Unran> unran_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ran_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // When rank 0 last reported a batch run.
  double flops_per_second_ ABSL_GUARDED_BY(mu_) = 0;  // Rank 0's batches, measured (0: none yet); sizes parts.
  std::deque<LogEntry> log_ ABSL_GUARDED_BY(mu_);  // log_.front().index == first_index_.
  int64_t first_index_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace orthoserve
