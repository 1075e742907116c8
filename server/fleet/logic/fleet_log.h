// The vocabulary of the fleet's coordinator and its members: a rank process (Member), a trainer
// rank's readiness for a step (ReadyReport), the entries of the ordered log (LogEntry), what a
// reading member says about itself (ReaderState) and the generation in force. Plain data; the
// rules that govern it are in coordinator.h, and the wire form in server/fleet/wire/fleet_codec.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/shape.h"
#include "server/fleet/logic/group_step.h"
#include "server/plan/matrix_plan.h"

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

// One trainer rank's readiness for a step: its blocks of the step's specs (`sent`, the same
// shared list its TrainerStep carries: a report made in process copies no spec).
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
  SenderBlocks sent;  // The trainer rank's blocks of the step's (shared) specs.
  // The trainer rank's shared-memory slices (TrainerStep::region_spans), checked against the
  // other ranks' before the batch is planned.
  std::vector<SpanUse> region_spans;
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

// An entry as the log holds it: appended once, never changed, shared by every reader that reads
// it (a batch entry of a big step is megabytes: one copy for all).
using SharedLogEntry = std::shared_ptr<const LogEntry>;

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

}  // namespace orthoserve
