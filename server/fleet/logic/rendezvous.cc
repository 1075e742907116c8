#include "server/fleet/logic/rendezvous.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fleet_change.h"
#include "common/logging.h"
#include "common/message_text.h"
#include "common/shared_span.h"
#include "common/status.h"
#include "server/distributed/batch.h"

namespace orthoserve {

void Rendezvous::Failed(const GroupKey& key, absl::Status status, const char* reason, bool refused,
                        StepDecisions& out) {
  StepDecision d;
  d.kind = StepDecision::Kind::kFailed;
  d.key = key;
  d.status = std::move(status);
  d.reason = reason;
  d.refused = refused;
  out.push_back(std::move(d));
}

void Rendezvous::Completed(const GroupKey& key, const Pending& p, StepDecisions& out) {
  StepDecision d;
  d.kind = StepDecision::Kind::kComplete;
  d.key = key;
  d.replay = !p.cached.empty();
  out.push_back(std::move(d));
}

void Rendezvous::Report(ReadyReport report, const Membership& membership, StepDecisions& out) {
  const GroupKey key = report.key;
  const std::string step = key.ToString();
  if (report.trainer_world < 1 || report.trainer_rank < 0 || report.trainer_rank >= report.trainer_world) {
    ErasePending(key);
    Failed(key,
           absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                   " is out of range for world ", report.trainer_world)),
           kStepFailureInvalid, false, out);
    return;
  }
  if (absl::Status other_run = CheckRun(report); !other_run.ok()) {
    LOG_WARNING("fleet") << other_run;
    Failed(key, std::move(other_run), kStepFailureRunMismatch, true, out);
    return;
  }
  if (report.attempt > 0) {
    // A retry of a step that ran must carry the blocks it ran with (see "Replays").
    if (absl::Status changed = CheckRetryDigest(report); !changed.ok()) {
      LOG_WARNING("fleet") << changed;
      ErasePending(key);
      Failed(key, std::move(changed), kStepFailureDigestMismatch, true, out);
      return;
    }
  }
  if (report.attempt > 0 && report.trainer_world > 1 && !pending_.contains(key)) {
    auto a = kept_.find(key.Group());
    if (a != kept_.end() && a->second.key == key) {
      StartReplay(std::move(report), membership, out);
      return;
    }
    if (a != kept_.end() && a->second.key.step > key.step) {
      Failed(key,
             absl::AbortedError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                             " retries a step older than the last one its group ran (",
                                             a->second.key.step, "); it cannot be run again")),
             kStepFailureAborted, false, out);
      return;
    }
  }
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    const auto count = tenant_pending_.find(key.tenant);
    if (options_.max_tenant_pending_steps > 0 && count != tenant_pending_.end() &&
        count->second >= options_.max_tenant_pending_steps) {
      Failed(key,
             absl::ResourceExhaustedError(absl::StrCat(
                 "step ", step, ": tenant \"", BoundedText(key.tenant), "\" has ", count->second,
                 " group steps waiting for their trainer ranks already, the most this fleet allows "
                 "(--max-tenant-pending-steps = ",
                 options_.max_tenant_pending_steps, ")")),
             kStepFailureLimit, true, out);
      return;
    }
    NewPending(key, report.trainer_world, membership.generation().number);
    it = pending_.find(key);
  }
  Pending& p = it->second;
  if (report.trainer_world != p.trainer_world) {
    int other = 0;
    while (other < p.trainer_world && p.report(other) == nullptr) ++other;
    const int said = p.trainer_world;
    ErasePending(it);
    Failed(key,
           absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                   " says world = ", report.trainer_world, " but rank ", other,
                                                   " said ", said)),
           kStepFailureInvalid, false, out);
    return;
  }
  const int rank = report.trainer_rank;
  auto slot = p.reports.find(rank);
  if (slot != p.reports.end()) {
    if (report.attempt <= slot->second.report.attempt) {
      ErasePending(it);
      Failed(key,
             absl::InvalidArgumentError(
                 absl::StrCat("step ", step, ": trainer rank ", rank, " joined twice (duplicate rank)")),
             kStepFailureInvalid, false, out);
      return;
    }
    // A retry replaces the report of the attempt it retries (whose stream is gone), or the
    // original a replay would have taken from a member's cache.
    VLOG("fleet", 1) << "step " << step << ": trainer rank " << rank << " attempt " << report.attempt
                     << " replaces attempt " << slot->second.report.attempt;
    p.cached.erase(rank);
    slot->second = Hold(std::move(report), p.specs);
  } else {
    p.reports.emplace(rank, Hold(std::move(report), p.specs));
  }
  if (p.complete()) Completed(key, p, out);
}

Rendezvous::Pending& Rendezvous::NewPending(const GroupKey& key, int world, int64_t generation) {
  Pending& p = pending_[key];
  p = Pending();
  p.first_report = absl::Now();
  p.first_generation = generation;
  p.trainer_world = world;
  claims_.try_emplace(key.AnyRun(), key.run);
  ++tenant_pending_[key.tenant];
  return p;
}

void Rendezvous::ErasePending(absl::flat_hash_map<GroupKey, Pending>::iterator it) {
  const GroupKey& key = it->first;
  auto claim = claims_.find(key.AnyRun());
  if (claim != claims_.end() && claim->second == key.run) claims_.erase(claim);
  auto count = tenant_pending_.find(key.tenant);
  if (count != tenant_pending_.end() && --count->second <= 0) tenant_pending_.erase(count);
  pending_.erase(it);
}

void Rendezvous::ErasePending(const GroupKey& key) {
  auto it = pending_.find(key);
  if (it != pending_.end()) ErasePending(it);
}

void Rendezvous::Withdraw(const GroupKey& key, Pending& p, int trainer_rank, StepDecisions& out) {
  if (p.reports.erase(trainer_rank) == 0) return;
  p.cached.erase(trainer_rank);
  StepDecision d;
  d.kind = StepDecision::Kind::kWithdrawn;
  d.key = key;
  out.push_back(std::move(d));
}

absl::Status Rendezvous::CheckRun(const ReadyReport& report) {
  const GroupKey& key = report.key;
  auto claim = claims_.find(key.AnyRun());
  if (claim == claims_.end() || claim->second == key.run) return absl::OkStatus();
  GroupKey holder = key;
  holder.run = claim->second;
  if (!pending_.contains(holder)) {  // Stale: that step is gone (every erasure drops its claim; this is a backstop).
    claims_.erase(claim);
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", key.ToString(), ": trainer rank ", report.trainer_rank, " of ", RunText(key.run),
      " is refused: the trainer ranks of ", RunText(claim->second),
      " are gathering this step of the same job and group right now, and two runs never share a step. Two runs (a "
      "relaunch, a sweep) are using one job name: give each its own job, or check that every rank of one run has the "
      "same run id (ORTHOSERVE_RUN_ID / TORCHELASTIC_RUN_ID)"));
}

std::optional<uint64_t> Rendezvous::OriginalDigest(const GroupKey& key, int trainer_rank) const {
  const GroupKey group = key.Group();
  if (auto ran = ran_.find(group); ran != ran_.end() && ran->second.key == key && trainer_rank >= 0 &&
                                    trainer_rank < static_cast<int>(ran->second.digests.size())) {
    return ran->second.digests[trainer_rank];
  }
  if (auto kept = kept_.find(group); kept != kept_.end() && kept->second.key == key && trainer_rank >= 0 &&
                                     trainer_rank < static_cast<int>(kept->second.holders.size()) &&
                                     !kept->second.holders[trainer_rank].empty()) {
    return kept->second.holders[trainer_rank].front().report.digest;
  }
  return std::nullopt;
}

absl::Status Rendezvous::CheckRetryDigest(const ReadyReport& report) const {
  const std::optional<uint64_t> original = OriginalDigest(report.key, report.trainer_rank);
  if (!original.has_value() || *original == report.digest) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "step ", report.key.ToString(), " of ", RunText(report.key.run), ": trainer rank ", report.trainer_rank,
      " retries (attempt ", report.attempt, ") with blocks other than those of the attempt that ran (digest ",
      absl::Hex(report.digest, absl::kZeroPad16), ", the original's ", absl::Hex(*original, absl::kZeroPad16),
      "): the step cannot be answered from the other ranks' kept inputs. The trainer changed its inputs between "
      "attempts (e.g. a momentum update applied twice)"));
}

absl::Status Rendezvous::Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                               int fleet_rank, StepDecisions& out) {
  auto it = pending_.find(key);
  // The report of the failed submission, when the step holds it: only the member that sent it
  // may take it back or abort the step for it.
  const Held* held = it != pending_.end() && submission != 0 ? it->second.report(trainer_rank) : nullptr;
  if (held != nullptr && held->report.submission != submission) held = nullptr;
  if (held != nullptr && held->report.fleet_rank != fleet_rank) {
    return absl::PermissionDeniedError(absl::StrCat("fleet rank ", fleet_rank, " aborts trainer rank ", trainer_rank,
                                                    " of step ", key.ToString(), ", whose report fleet rank ",
                                                    held->report.fleet_rank, " holds: only that member may"));
  }
  if (reason.code() == absl::StatusCode::kUnavailable) {
    // The trainer's stream failed for a reason a retry cures (its fleet rank is draining or
    // lost its fleet): only its own report goes; the other ranks keep waiting for the retry.
    if (it == pending_.end()) return absl::OkStatus();
    Pending& p = it->second;
    const Held* report = p.report(trainer_rank);
    if (report != nullptr && (submission == 0 || report->report.submission == submission)) {
      Withdraw(key, p, trainer_rank, out);
      if (p.arrived() == 0) ErasePending(it);
    }
    return absl::OkStatus();
  }
  if (it != pending_.end()) ErasePending(it);
  Failed(key,
         absl::AbortedError(absl::StrCat("step ", key.ToString(), " aborted: trainer rank ", trainer_rank,
                                         " failed: ", reason.ToString())),
         reason.code() == absl::StatusCode::kCancelled ? kStepFailureCancelled : kStepFailureAborted, false, out);
  return absl::OkStatus();
}

void Rendezvous::StartReplay(ReadyReport report, const Membership& membership, StepDecisions& out) {
  const GroupKey key = report.key;
  const int world = report.trainer_world;
  LOG_INFO("fleet") << "step " << key.ToString() << ": trainer rank " << report.trainer_rank << " retries (attempt "
                    << report.attempt << ") a step that was planned before; members' kept inputs stand in for the ranks "
                       "that do not retry";
  Pending& p = NewPending(key, world, membership.generation().number);
  const int rank = report.trainer_rank;
  p.reports.emplace(rank, Hold(std::move(report), p.specs));
  FillReplay(key, membership, out);
}

void Rendezvous::FillReplay(const GroupKey& key, const Membership& membership, StepDecisions& out) {
  auto it = pending_.find(key);
  auto k = kept_.find(key.Group());
  if (it == pending_.end() || k == kept_.end() || !(k->second.key == key)) return;
  Pending& p = it->second;
  const Kept& kept = k->second;
  if (static_cast<int>(kept.holders.size()) != p.trainer_world) return;
  // A replay combines the retries with the originals' kept blocks: each retry must be known to
  // carry its own original's blocks (checked as it arrived, while the step's record lasts; again
  // here against what the members keep).
  for (const auto& [t, held] : p.reports) {
    if (p.cached.contains(t)) continue;
    absl::Status changed = CheckRetryDigest(held.report);
    if (changed.ok() && !OriginalDigest(key, t).has_value()) {
      changed = absl::AbortedError(absl::StrCat(
          "step ", key.ToString(), " of ", RunText(key.run), ": trainer rank ", t,
          " retries a step that ran, but the blocks it ran with are no longer known here, so the retry cannot be "
          "answered from the other ranks' kept inputs"));
    }
    if (!changed.ok()) {
      LOG_WARNING("fleet") << changed;
      ErasePending(it);
      Failed(key, std::move(changed), kStepFailureDigestMismatch, true, out);
      return;
    }
  }
  for (int t = 0; t < p.trainer_world; ++t) {
    if (p.report(t) != nullptr) continue;
    for (const Held& holder : kept.holders[t]) {
      // Its inputs are on that rank only while it is the same process and a member.
      if (!membership.IsMember(holder.report.fleet_rank, holder.report.incarnation)) continue;
      p.reports.emplace(t, holder);
      p.cached.insert(t);
      break;
    }
  }
  if (p.complete()) Completed(key, p, out);
}

void Rendezvous::Keep(const ReadyReport& r, int reader_rank, uint64_t reader_incarnation, const Membership& membership,
                      StepDecisions& out) {
  // Only what this very process keeps, of a group step, newer than what is known.
  if (r.fleet_rank != reader_rank || r.incarnation != reader_incarnation || r.trainer_world < 2 ||
      r.trainer_rank < 0 || r.trainer_rank >= r.trainer_world) {
    return;
  }
  Kept& kept = kept_[r.key.Group()];
  if (kept.holders.empty() || kept.key.step < r.key.step || static_cast<int>(kept.holders.size()) != r.trainer_world) {
    if (!kept.holders.empty() && kept.key.step > r.key.step) return;
    kept.key = r.key;
    kept.holders.assign(r.trainer_world, {});
    kept.specs.reset();
  }
  if (!(kept.key == r.key)) return;
  kept.at = absl::Now();
  if (static_cast<int>(r.step_digests.size()) == r.trainer_world) {
    // The step's digests as its batch carried them: what a coordinator that did not plan it
    // (it restarted since) compares retries with.
    Ran& ran = ran_[r.key.Group()];
    if (ran.digests.empty() || ran.key.step < r.key.step) ran = Ran{r.key, absl::Now(), r.step_digests};
  }
  std::vector<Held>& holders = kept.holders[r.trainer_rank];
  auto same =
      std::find_if(holders.begin(), holders.end(), [&](const Held& h) { return h.report.fleet_rank == r.fleet_rank; });
  if (same != holders.end()) {
    *same = Hold(r, kept.specs);
  } else {
    holders.push_back(Hold(r, kept.specs));
  }
  FillReplay(r.key, membership, out);
}

void Rendezvous::Reformed(const Membership& membership, StepDecisions& out) {
  // Reports held by ranks that are no longer members cannot take part: withdraw them (their
  // streams fail, and the trainers retry on a member).
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    std::vector<int> gone;
    for (const auto& [r, held] : p.reports) {
      if (!membership.IsMember(held.report.fleet_rank, held.report.incarnation)) gone.push_back(r);
    }
    for (int r : gone) Withdraw(it->first, p, r, out);
    if (p.arrived() == 0) {
      ErasePending(it++);
    } else {
      ++it;
    }
  }
  // Ranks that keep a replay's inputs may have become members just now.
  std::vector<GroupKey> replays;
  for (const auto& [key, p] : pending_) {
    auto k = kept_.find(key.Group());
    if (k != kept_.end() && k->second.key == key) replays.push_back(key);
  }
  for (const GroupKey& key : replays) FillReplay(key, membership, out);
}

std::string Rendezvous::MissingRanks(const Pending& p) {
  // The first ranks only: a step that claims a world of 65536 and got one report must not cost
  // a list of 65535.
  constexpr int kShown = 16;
  std::vector<int64_t> missing;
  for (int r = 0; r < p.trainer_world && static_cast<int>(missing.size()) < kShown; ++r) {
    if (p.report(r) == nullptr) missing.push_back(r);
  }
  const int more = p.trainer_world - p.arrived() - static_cast<int>(missing.size());
  return more > 0 ? absl::StrCat(absl::StrJoin(missing, ", "), ", ... (and ", more, " more)")
                  : absl::StrJoin(missing, ", ");
}

void Rendezvous::Expire(absl::Time now, int64_t generation, absl::Time& next, StepDecisions& out) {
  std::vector<GroupKey> expired;
  for (auto& [key, p] : pending_) {
    if (p.complete()) continue;  // It waits for its turn, not for trainer ranks.
    const absl::Time deadline = p.first_report + options_.rendezvous_timeout;
    if (now >= deadline) {
      expired.push_back(key);
      continue;
    }
    next = std::min(next, deadline);
    if (!p.warned && now >= p.first_report + options_.stall_warning) {
      p.warned = true;
      LOG_WARNING("fleet") << "step " << key.ToString() << " has waited " << (now - p.first_report)
                           << " for trainer ranks [" << MissingRanks(p) << "] of " << p.trainer_world;
    } else if (!p.warned) {
      next = std::min(next, p.first_report + options_.stall_warning);
    }
  }
  for (const GroupKey& key : expired) {
    auto it = pending_.find(key);
    const Pending& p = it->second;
    // A missing rank whose fleet rank dropped out while the step waited was cut off by the
    // fleet change, not by its trainer: a retry may well succeed.
    const bool fleet_changed = p.first_generation != generation;
    absl::Status status = absl::AbortedError(absl::StrCat(
        "step ", key.ToString(), " aborted: rendezvous timeout after ", absl::FormatDuration(options_.rendezvous_timeout),
        ": trainer ranks [", MissingRanks(p), "] of ", p.trainer_world, " did not arrive",
        fleet_changed ? " (the fleet's membership changed meanwhile)" : ""));
    ErasePending(it);
    Failed(key, fleet_changed ? MarkFleetChange(std::move(status)) : std::move(status), kStepFailureTimeout, false,
           out);
  }
}

void Rendezvous::Sweep(absl::Time now) {
  // Claims whose step is gone (a backstop: every erasure drops its claim).
  for (auto it = claims_.begin(); it != claims_.end();) {
    GroupKey holder = it->first;
    holder.run = it->second;
    if (pending_.contains(holder)) {
      ++it;
    } else {
      claims_.erase(it++);
    }
  }
  // A ran step's digests last while members keep it, and at least a few rendezvous timeouts.
  for (auto it = ran_.begin(); it != ran_.end();) {
    auto kept = kept_.find(it->first);
    const bool kept_still = kept != kept_.end() && kept->second.key == it->second.key;
    if (!kept_still && now - it->second.at > 3 * options_.rendezvous_timeout) {
      ran_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (now - it->second.at > options_.rendezvous_timeout) {
      kept_.erase(it++);
    } else {
      ++it;
    }
  }
}

bool Rendezvous::complete(const GroupKey& key) const {
  auto it = pending_.find(key);
  return it != pending_.end() && it->second.complete();
}

const std::vector<MatrixPlan>* Rendezvous::specs(const GroupKey& key) const {
  auto it = pending_.find(key);
  if (it == pending_.end() || !it->second.complete()) return nullptr;
  return it->second.report(0)->specs().get();
}

Rendezvous::Held Rendezvous::Hold(ReadyReport report, SharedSpecs& shared) {
  auto same = [](const MatrixPlan& a, const MatrixPlan& b) {
    return a.name == b.name && a.shape == b.shape && a.layout == b.layout && a.view == b.view && a.dtype == b.dtype &&
           a.result_dtype == b.result_dtype && a.options == b.options && a.algorithm == b.algorithm &&
           a.partition_dim == b.partition_dim && a.owner == b.owner && a.blocks.empty() && b.blocks.empty();
  };
  const SpecList& own = *report.sent.specs;
  if (shared == nullptr) {
    shared = report.sent.specs;
  } else if (report.sent.specs != shared && std::equal(own.begin(), own.end(), shared->begin(), shared->end(), same)) {
    report.sent.specs = shared;  // Its own list goes (unless its sender holds it too: in process).
  }
  report.sent.blocks.shrink_to_fit();  // Decoded one by one: up to twice the room they need.
  report.step_digests = std::vector<uint64_t>();  // A notice's: taken into ran_, not held W times.
  return Held{std::move(report)};
}

absl::Status Rendezvous::CheckRegionOverlaps(const std::string& step, const Pending& p) {
  std::vector<SpanUse> uses;
  for (int r = 0; r < p.trainer_world; ++r) {
    const std::vector<SpanUse>& spans = p.report(r)->report.region_spans;
    uses.insert(uses.end(), spans.begin(), spans.end());
  }
  const std::optional<std::pair<size_t, size_t>> overlap = FirstWriteOverlap(uses);
  if (!overlap.has_value()) return absl::OkStatus();
  const SpanUse& a = uses[overlap->first];
  const SpanUse& b = uses[overlap->second];
  return absl::InvalidArgumentError(absl::StrCat(
      "step ", step, ": ", SpanUseText(a), " overlaps ", SpanUseText(b),
      " in shared memory; a result slice may overlap no other slice of the step, of any trainer rank (nothing was "
      "written)"));
}

absl::StatusOr<LogEntry> Rendezvous::BuildBatch(const GroupKey& key, const Pending& p, const Generation& generation,
                                                const std::vector<double>& costs) const {
  const Held& first = *p.report(0);
  const SpecList& first_specs = *first.specs();
  const std::string step = key.ToString();
  for (int r = 1; r < p.trainer_world; ++r) {
    const Held& other = *p.report(r);
    if (other.specs() == first.specs()) continue;  // One list, held once: identical.
    const SpecList& other_specs = *other.specs();
    if (other_specs.size() != first_specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank 0 sent ", first_specs.size(),
                                                     " matrices but rank ", r, " sent ", other_specs.size(),
                                                     "; every rank must send the same spec list"));
    }
    for (size_t i = 0; i < first_specs.size(); ++i) {
      std::string diff = FirstSpecDifference(first_specs[i], other_specs[i]);
      if (!diff.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("step ", step, ": specs differ between trainer ranks 0 and ",
                                                       r, " at matrix ", i, " (\"", first_specs[i].name, "\"): ", diff));
      }
    }
  }
  RETURN_IF_ERROR(CheckRegionOverlaps(step, p));
  // Placements name collective ranks: positions in the generation's member list. Every report
  // here comes from a current member (others were withdrawn when it dropped out).
  std::vector<int> position(options_.fleet_world, -1);
  for (size_t i = 0; i < generation.members.size(); ++i) position[generation.members[i].rank] = static_cast<int>(i);
  LogEntry entry;
  entry.key = key;
  BatchPlan& plan = entry.plan;
  plan.trainer_world = p.trainer_world;
  plan.fleet_world = static_cast<int>(generation.members.size());
  plan.matrices = first_specs;
  // Each rank's report looked up once (W · matrices placements follow): its collective rank and
  // its blocks.
  std::vector<int> collective_rank(p.trainer_world);
  std::vector<const Block*> blocks(p.trainer_world);
  for (int r = 0; r < p.trainer_world; ++r) {
    const ReadyReport& report = p.report(r)->report;
    collective_rank[r] = position[report.fleet_rank];
    blocks[r] = report.sent.blocks.data();
    entry.submissions.push_back(report.submission);
    entry.digests.push_back(report.digest);
  }
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    MatrixPlan& m = plan.matrices[i];
    m.blocks.clear();
    m.blocks.reserve(p.trainer_world);
    for (int r = 0; r < p.trainer_world; ++r) m.blocks.push_back(BlockPlacement{r, collective_rank[r], blocks[r][i]});
  }
  if (!p.cached.empty()) {
    entry.cached.assign(p.trainer_world, false);
    for (int r : p.cached) entry.cached[r] = true;
  }
  if (costs.size() != plan.matrices.size()) {
    return absl::InternalError(absl::StrCat("step ", step, ": ", costs.size(), " cost estimates for ",
                                            plan.matrices.size(), " matrices"));
  }
  AssignOwners(plan, costs);
  return entry;
}

std::optional<absl::StatusOr<LogEntry>> Rendezvous::Take(const GroupKey& key, const Generation& generation,
                                                         const std::vector<double>& costs) {
  auto it = pending_.find(key);
  if (it == pending_.end() || !it->second.complete()) return std::nullopt;
  absl::StatusOr<LogEntry> batch = BuildBatch(key, it->second, generation, costs);
  if (batch.ok() && it->second.trainer_world > 1) {
    // What each trainer rank's blocks were, for its retries (see "Replays").
    ran_[key.Group()] = Ran{key, absl::Now(), batch->digests};
  }
  ErasePending(it);
  return batch;
}

}  // namespace orthoserve
