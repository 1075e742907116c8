// Where a group step's trainer ranks meet: the rendezvous and replay part of the coordinator
// (coordinator.h: "Runs", "Replays", "Limits", "Steps"). It holds the pending steps, what
// members keep of the last step of each group and the digests retries are compared with, and
// builds a complete step's batch. What it decides about a step — complete, failed, a rank
// withdrawn — it hands back as StepDecisions for the coordinator to carry out in the log and the
// order of batches. Not thread-safe: the coordinator's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/fleet/logic/fleet_log.h"
#include "server/fleet/logic/membership.h"

namespace orthoserve {

// What a call of the rendezvous decided about step `key`, for the coordinator to carry out in
// the order given.
struct StepDecision {
  enum class Kind {
    kComplete,   // Every trainer rank has a report: append it, or queue it for its turn.
    kFailed,     // Append failure `status` (marked when a fleet change caused it) for `reason`.
    kWithdrawn,  // A report was withdrawn: a queued step is not complete any more.
  };
  Kind kind = Kind::kComplete;
  GroupKey key;
  absl::Status status;      // kFailed.
  const char* reason = "";  // kFailed: one of the kStepFailure*.
  bool refused = false;     // kFailed: a refusal that keeps answers their callers' own (Options::on_refusal).
  bool replay = false;      // kComplete: a replay (never divided).
};
using StepDecisions = std::vector<StepDecision>;

class Rendezvous {
 public:
  struct Options {
    int fleet_world = 1;
    absl::Duration rendezvous_timeout = absl::Seconds(60);  // From a step's first report.
    absl::Duration stall_warning = absl::Seconds(60);       // Log the missing ranks once after this.
    int max_tenant_pending_steps = 0;                       // 0: no limit.
  };
  explicit Rendezvous(const Options& options) : options_(options) {}

  // A ready report from a member of `membership`'s generation (the coordinator checked that).
  void Report(ReadyReport report, const Membership& membership, StepDecisions& out);
  // Trainer rank `trainer_rank` of step `key` failed with `reason` on member `fleet_rank`
  // (see Coordinator::Abort). PERMISSION_DENIED when the step holds the report of `submission`
  // from another member; OK otherwise.
  absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                     int fleet_rank, StepDecisions& out);
  // A kept step's report from the member (rank, incarnation) reading the log (ReaderState::kept).
  void Keep(const ReadyReport& kept, int reader_rank, uint64_t reader_incarnation, const Membership& membership,
            StepDecisions& out);
  // After a new generation: withdraws the reports of ranks that are no longer members, and fills
  // replays from ranks that became members.
  void Reformed(const Membership& membership, StepDecisions& out);
  // Fails the steps whose ranks did not all arrive within the rendezvous timeout (a fleet
  // change when the generation changed meanwhile), warns once about stalled ones; `next`
  // becomes no later than the next deadline.
  void Expire(absl::Time now, int64_t generation, absl::Time& next, StepDecisions& out);
  // Forgets what members kept, and the digests of steps that ran, once they are too old to retry.
  void Sweep(absl::Time now);

  // Every trainer rank of pending step `key` has a report.
  bool complete(const GroupKey& key) const;
  // The spec list of complete step `key` (shared by its reports); null when not complete.
  const std::vector<MatrixPlan>* specs(const GroupKey& key) const;
  // Takes complete step `key` out: its batch on the generation's collective ranks (AUTO owners
  // chosen by `costs`, each matrix's EstimatedCost), or INVALID_ARGUMENT naming the first
  // difference between the ranks' reports. nullopt when the step is not complete.
  std::optional<absl::StatusOr<LogEntry>> Take(const GroupKey& key, const Generation& generation,
                                               const std::vector<double>& costs);
  size_t pending() const { return pending_.size(); }

 private:
  // A ready report as the rendezvous holds it: its spec list one shared by every report of a step
  // that sent an identical one. W copies of one list were most of what the coordinator held
  // (315 MB for a pending step of 560 matrices over W = 1024 trainer ranks, and as much again for
  // the kept step; bench/results/plan_scale.md).
  struct Held {
    ReadyReport report;
    const SharedSpecs& specs() const { return report.sent.specs; }
  };
  // Holds `report`, sharing `shared`'s list when the report's own is identical in every field
  // (and dropping its own); `shared` becomes the report's list when it is null.
  static Held Hold(ReadyReport report, SharedSpecs& shared);
  struct Pending {
    absl::Time first_report;
    int64_t first_generation = 0;  // The generation at the first report.
    int trainer_world = 1;
    // The reports that arrived, by trainer rank: memory in proportion to the ranks that reported,
    // not to the world the first report claimed.
    absl::flat_hash_map<int, Held> reports;
    // The first spec list held, which the identical ones share.
    SharedSpecs specs;
    absl::flat_hash_set<int> cached;  // Replay: trainer ranks whose report is the original, its inputs in a member's cache.
    bool warned = false;

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
    SharedSpecs specs;  // As Pending::specs.
  };
  // The last step of a group appended as a batch: each trainer rank's digest (ReadyReport::digest),
  // what its retries are compared with.
  struct Ran {
    GroupKey key;
    absl::Time at;
    std::vector<uint64_t> digests;
  };

  // A new pending step of `key` for trainer world `world` (the first report of it, or a replay's)
  // in `generation`: claims the step for key.run (see "Runs") and counts it for its tenant.
  Pending& NewPending(const GroupKey& key, int world, int64_t generation);
  // Forgets pending step `it`: its claim and its tenant's count go with it.
  void ErasePending(absl::flat_hash_map<GroupKey, Pending>::iterator it);
  void ErasePending(const GroupKey& key);
  // Takes trainer rank `trainer_rank`'s report out of `p` (a queued step is not complete any more).
  void Withdraw(const GroupKey& key, Pending& p, int trainer_rank, StepDecisions& out);
  // FAILED_PRECONDITION when another run's ranks are gathering the same step (see "Runs").
  absl::Status CheckRun(const ReadyReport& report);
  // The digest of trainer rank `trainer_rank`'s blocks in step `key` as it ran: from the batch
  // appended for it, or from what members keep of it; nullopt when neither is known.
  std::optional<uint64_t> OriginalDigest(const GroupKey& key, int trainer_rank) const;
  // ABORTED when `report` retries a step that ran with blocks whose digest differs from its
  // original's (see "Replays"); OK when they agree or the step is not known to have run.
  absl::Status CheckRetryDigest(const ReadyReport& report) const;
  // A retried report of the step its group's members keep: starts the replay.
  void StartReplay(ReadyReport report, const Membership& membership, StepDecisions& out);
  // Fills replay slots from what members keep; the step is complete when every slot is filled.
  void FillReplay(const GroupKey& key, const Membership& membership, StepDecisions& out);
  // `p` is complete: decides so.
  static void Completed(const GroupKey& key, const Pending& p, StepDecisions& out);
  // Complete step `p`'s batch (see Take).
  // INVALID_ARGUMENT naming both slices when a result slice of one report overlaps any slice of
  // another (or of the same) report in shared memory (ReadyReport::region_spans).
  static absl::Status CheckRegionOverlaps(const std::string& step, const Pending& p);
  absl::StatusOr<LogEntry> BuildBatch(const GroupKey& key, const Pending& p, const Generation& generation,
                                      const std::vector<double>& costs) const;
  // "r1, r2, ..." of the trainer ranks `p` still waits for (the first few, and how many more).
  static std::string MissingRanks(const Pending& p);
  // Decides that step `key` fails with `status` for `reason` (it stays pending unless erased apart).
  static void Failed(const GroupKey& key, absl::Status status, const char* reason, bool refused, StepDecisions& out);

  const Options options_;
  absl::flat_hash_map<GroupKey, Pending> pending_;
  // By GroupKey::AnyRun(): the run whose ranks the pending step of that key gathers (see "Runs").
  absl::flat_hash_map<GroupKey, std::string> claims_;
  absl::flat_hash_map<std::string, int> tenant_pending_;  // Pending steps by tenant.
  absl::flat_hash_map<GroupKey, Kept> kept_;              // By GroupKey::Group().
  absl::flat_hash_map<GroupKey, Ran> ran_;                // By GroupKey::Group().
};

}  // namespace orthoserve
