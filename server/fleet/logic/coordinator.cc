// Implementation of server/fleet/logic/coordinator.h: steps, plans and the log. Membership (joins,
// leaves, liveness, generations) is in coordinator_membership.cc.
#include "server/fleet/logic/coordinator.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fleet_change.h"
#include "common/logging.h"
#include "common/message_text.h"
#include "server/distributed/batch.h"

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
  return std::unique_ptr<Coordinator>(new Coordinator(options));
}

Coordinator::Coordinator(const Options& options)
    : options_(options), epoch_(RandomNonZeroId()), known_(options.fleet_world) {
  timer_ = std::thread([this] { TimerLoop(); });
}

Coordinator::~Coordinator() {
  Shutdown();
  if (timer_.joinable()) timer_.join();
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  log_cv_.SignalAll();
  timer_cv_.SignalAll();
}

size_t Coordinator::pending_steps() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

void Coordinator::AppendLocked(LogEntry entry) {
  entry.index = first_index_ + static_cast<int64_t>(log_.size());
  if (!entry.membership() && entry.generation == 0) entry.generation = generation_.number;
  VLOG("fleet", 1) << "log " << entry.index << " gen " << entry.generation << " "
                   << (entry.membership() ? "membership" : entry.key.ToString()) << " " << entry.status
                   << (entry.part_offset > 0 || entry.more_parts
                           ? absl::StrCat(" part: matrices ", entry.part_offset, "..",
                                          entry.part_offset + static_cast<int64_t>(entry.plan.matrices.size()) - 1,
                                          entry.more_parts ? ", more follow" : ", the last")
                           : std::string());
  log_.push_back(std::move(entry));
  log_cv_.SignalAll();
}

void Coordinator::AppendFailureLocked(const GroupKey& key, absl::Status status, bool fleet_change,
                                      const char* failure) {
  LogEntry entry;
  entry.key = key;
  entry.status = fleet_change ? MarkFleetChange(std::move(status)) : std::move(status);
  entry.failure = failure;
  AppendLocked(std::move(entry));
}

absl::Status Coordinator::Report(ReadyReport report) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down; retry");
  if (report.epoch != epoch_) {
    return absl::FailedPreconditionError("the fleet coordinator restarted since this rank joined; join again");
  }
  if (!IsMemberLocked(report.fleet_rank, report.incarnation)) {
    return absl::UnavailableError(absl::StrCat("fleet rank ", report.fleet_rank, " is not a member of generation ",
                                               generation_.number, " of the fleet; retry on a ready member"));
  }
  const GroupKey key = report.key;
  const std::string step = key.ToString();
  if (report.trainer_world < 1 || report.trainer_rank < 0 || report.trainer_rank >= report.trainer_world) {
    ErasePendingLocked(key);
    AppendFailureLocked(key,
                        absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                                " is out of range for world ", report.trainer_world)),
                        false, kStepFailureInvalid);
    return absl::OkStatus();
  }
  if (absl::Status other_run = CheckRunLocked(report); !other_run.ok()) {
    LOG_WARNING("fleet") << other_run;
    RefusedLocked(kStepFailureRunMismatch);
    AppendFailureLocked(key, std::move(other_run), false, kStepFailureRunMismatch);
    return absl::OkStatus();
  }
  if (report.attempt > 0) {
    // A retry of a step that ran must carry the blocks it ran with (see "Replays").
    if (absl::Status changed = CheckRetryDigestLocked(report); !changed.ok()) {
      LOG_WARNING("fleet") << changed;
      RefusedLocked(kStepFailureDigestMismatch);
      ErasePendingLocked(key);
      AppendFailureLocked(key, std::move(changed), false, kStepFailureDigestMismatch);
      return absl::OkStatus();
    }
  }
  if (report.attempt > 0 && report.trainer_world > 1 && !pending_.contains(key)) {
    auto a = kept_.find(key.Group());
    if (a != kept_.end() && a->second.key == key) {
      StartReplayLocked(std::move(report));
      return absl::OkStatus();
    }
    if (a != kept_.end() && a->second.key.step > key.step) {
      AppendFailureLocked(key,
                          absl::AbortedError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                          " retries a step older than the last one its group ran (",
                                                          a->second.key.step, "); it cannot be run again")),
                          false, kStepFailureAborted);
      return absl::OkStatus();
    }
  }
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    const auto count = tenant_pending_.find(key.tenant);
    if (options_.max_tenant_pending_steps > 0 && count != tenant_pending_.end() &&
        count->second >= options_.max_tenant_pending_steps) {
      RefusedLocked(kStepFailureLimit);
      AppendFailureLocked(key,
                          absl::ResourceExhaustedError(absl::StrCat(
                              "step ", step, ": tenant \"", BoundedText(key.tenant), "\" has ", count->second,
                              " group steps waiting for their trainer ranks already, the most this fleet allows "
                              "(--max-tenant-pending-steps = ",
                              options_.max_tenant_pending_steps, ")")),
                          false, kStepFailureLimit);
      return absl::OkStatus();
    }
    NewPendingLocked(key, report.trainer_world);
    it = pending_.find(key);
  }
  Pending& p = it->second;
  if (report.trainer_world != p.trainer_world) {
    int other = 0;
    while (other < p.trainer_world && p.report(other) == nullptr) ++other;
    const int said = p.trainer_world;
    ErasePendingLocked(it);
    AppendFailureLocked(key,
                        absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                                " says world = ", report.trainer_world, " but rank ",
                                                                other, " said ", said)),
                        false, kStepFailureInvalid);
    return absl::OkStatus();
  }
  const int rank = report.trainer_rank;
  auto slot = p.reports.find(rank);
  if (slot != p.reports.end()) {
    if (report.attempt <= slot->second.report.attempt) {
      ErasePendingLocked(it);
      AppendFailureLocked(key,
                          absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", rank,
                                                                  " joined twice (duplicate rank)")),
                          false, kStepFailureInvalid);
      return absl::OkStatus();
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
  if (p.complete()) CompleteLocked(key);
  return absl::OkStatus();
}

Coordinator::Pending& Coordinator::NewPendingLocked(const GroupKey& key, int world) {
  Pending& p = pending_[key];
  p = Pending();
  p.first_report = absl::Now();
  p.first_generation = generation_.number;
  p.trainer_world = world;
  claims_.try_emplace(key.AnyRun(), key.run);
  ++tenant_pending_[key.tenant];
  timer_cv_.SignalAll();
  return p;
}

void Coordinator::ErasePendingLocked(absl::flat_hash_map<GroupKey, Pending>::iterator it) {
  const GroupKey& key = it->first;
  auto claim = claims_.find(key.AnyRun());
  if (claim != claims_.end() && claim->second == key.run) claims_.erase(claim);
  auto count = tenant_pending_.find(key.tenant);
  if (count != tenant_pending_.end() && --count->second <= 0) tenant_pending_.erase(count);
  pending_.erase(it);
}

void Coordinator::ErasePendingLocked(const GroupKey& key) {
  auto it = pending_.find(key);
  if (it != pending_.end()) ErasePendingLocked(it);
}

absl::Status Coordinator::CheckRunLocked(const ReadyReport& report) {
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

std::optional<uint64_t> Coordinator::OriginalDigestLocked(const GroupKey& key, int trainer_rank) const {
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

absl::Status Coordinator::CheckRetryDigestLocked(const ReadyReport& report) const {
  const std::optional<uint64_t> original = OriginalDigestLocked(report.key, report.trainer_rank);
  if (!original.has_value() || *original == report.digest) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "step ", report.key.ToString(), " of ", RunText(report.key.run), ": trainer rank ", report.trainer_rank,
      " retries (attempt ", report.attempt, ") with blocks other than those of the attempt that ran (digest ",
      absl::Hex(report.digest, absl::kZeroPad16), ", the original's ", absl::Hex(*original, absl::kZeroPad16),
      "): the step cannot be answered from the other ranks' kept inputs. The trainer changed its inputs between "
      "attempts (e.g. a momentum update applied twice)"));
}

namespace {

// An upper bound of the bytes batch `entry` takes in the fleet's log, as fleet_codec encodes it
// (LogEntryToProto): every varint counted at its widest (10 bytes, 11 with its tag), every
// length-delimited field with 6 bytes of tag and length, a block as 4 varints. Loose (a
// placement is ~15 bytes, counted as 62), and cheap: it reads sizes, it encodes nothing.
size_t EntryBytesBound(const LogEntry& entry) {
  constexpr size_t kVarint = 11;
  constexpr size_t kField = 6;
  constexpr size_t kBlock = kField + 4 * kVarint;
  size_t bytes = 16 * kVarint + 4 * kField + entry.key.tenant.size() + entry.key.job.size() + entry.key.group.size() +
                 entry.key.run.size() + std::string(entry.status.message()).size() + entry.failure.size() +
                 entry.submissions.size() * kVarint + entry.cached.size() * 2;
  for (const MatrixPlan& m : entry.plan.matrices) {
    bytes += 2 * kField + 8 * kVarint + kField + m.name.size() + m.shape.size() * kVarint;
    // NsOptions: every field set, custom triples as 3 doubles each, split_qkv.
    bytes += kField + 12 * kVarint + m.options.custom_coefficients.size() * (kField + 3 * 9) +
             m.options.split_qkv.size() * kVarint;
    bytes += m.blocks.size() * (kField + 2 * kVarint + kBlock);
  }
  return bytes;
}

}  // namespace

absl::Status Coordinator::CheckEntrySizeLocked(const LogEntry& entry) const {
  if (options_.max_entry_bytes == 0) return absl::OkStatus();
  const size_t bound = EntryBytesBound(entry);
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

namespace {

double CostOf(const std::vector<MatrixPlan>& matrices, size_t begin, size_t end) {
  double cost = 0;
  for (size_t i = begin; i < end; ++i) cost += EstimatedCost(matrices[i]);
  return cost;
}

}  // namespace

void Coordinator::CompleteLocked(const GroupKey& key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  if (!PacingLocked()) {
    AppendStepLocked(key);
    return;
  }
  if (p.queued) return;  // A retry replaced a report of a step already in the queue.
  p.queued = true;
  const SpecList& specs = *p.report(0)->specs;
  // A replay is not divided (its kept inputs are taken whole).
  const bool replay = !p.cached.empty();
  p.part_end = replay ? specs.size() : PartEndLocked(specs, 0, static_cast<int>(generation_.members.size()));
  ready_.Push(key.tenant, key.job, CostOf(specs, 0, p.part_end), Ready{key, false});
  ReleaseLocked();
}

size_t Coordinator::PartEndLocked(const std::vector<MatrixPlan>& matrices, size_t begin, int members) const {
  if (options_.part_time <= absl::ZeroDuration() || begin >= matrices.size()) return matrices.size();
  const double budget = flops_per_second_ * absl::ToDoubleSeconds(options_.part_time);
  // At least one matrix per member: a part of fewer would leave members idle (an AUTO or
  // ROW_SHARDED matrix is computed on one of them).
  const size_t end = std::min(matrices.size(), begin + static_cast<size_t>(std::max(members, 1)));
  double cost = CostOf(matrices, begin, end);
  size_t more = end;
  while (more < matrices.size() && cost + EstimatedCost(matrices[more]) <= budget) cost += EstimatedCost(matrices[more++]);
  return more;
}

void Coordinator::AppendStepLocked(const GroupKey& key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  const size_t part_end = it->second.part_end;
  absl::StatusOr<LogEntry> batch = BuildBatchLocked(key, it->second);
  if (batch.ok() && it->second.trainer_world > 1) {
    // What each trainer rank's blocks were, for its retries (see "Replays").
    ran_[key.Group()] = Ran{key, absl::Now(), batch->digests};
  }
  ErasePendingLocked(it);
  if (batch.ok()) {
    if (absl::Status size = CheckEntrySizeLocked(*batch); !size.ok()) {
      RefusedLocked(kStepFailureLimit);
      AppendFailureLocked(key, std::move(size), false, kStepFailureLimit);
      return;
    }
  }
  if (!batch.ok()) {
    AppendFailureLocked(key, batch.status(), false, kStepFailureInvalid);
    return;
  }
  // A divided step of the same key still running (a retry completed before its parts did) ends
  // first, in one last part.
  if (divided_.contains(key)) AppendPartLocked(key, /*rest=*/true);
  const size_t n = batch->plan.matrices.size();
  if (part_end == 0 || part_end >= n || !PacingLocked()) {
    const double cost = CostOf(batch->plan.matrices, 0, n);
    AppendLocked(*std::move(batch));
    unran_.push_back(Unran{log_.back().index, absl::Now(), cost});
    return;
  }
  Divided& d = divided_[key];
  d.batch = *std::move(batch);
  d.batch.generation = generation_.number;
  d.next = 0;
  d.end = part_end;
  AppendPartLocked(key, /*rest=*/false);
}

void Coordinator::AppendPartLocked(const GroupKey& key, bool rest) {
  auto it = divided_.find(key);
  if (it == divided_.end()) return;
  Divided& d = it->second;
  const std::vector<MatrixPlan>& all = d.batch.plan.matrices;
  // Parts of an earlier generation cannot run any more: the rest goes at once, and fails.
  if (rest || d.batch.generation != generation_.number || !PacingLocked()) d.end = all.size();
  LogEntry part;
  part.key = key;
  part.plan.trainer_world = d.batch.plan.trainer_world;
  part.plan.fleet_world = d.batch.plan.fleet_world;
  part.plan.matrices.assign(all.begin() + static_cast<std::ptrdiff_t>(d.next),
                            all.begin() + static_cast<std::ptrdiff_t>(d.end));
  part.submissions = d.batch.submissions;
  part.digests = d.batch.digests;
  part.part_offset = static_cast<int64_t>(d.next);
  part.more_parts = d.end < all.size();
  part.generation = d.batch.generation;  // Planned for that generation's collective ranks.
  AssignOwners(part.plan);  // Balanced within the part, which runs alone.
  const double cost = CostOf(all, d.next, d.end);
  AppendLocked(std::move(part));
  unran_.push_back(Unran{log_.back().index, absl::Now(), cost});
  if (d.end == all.size()) {
    divided_.erase(it);
    return;
  }
  d.next = d.end;
  d.end = PartEndLocked(all, d.next, d.batch.plan.fleet_world);
  // Ahead of the job's later steps: a job's steps still run in order, parts of other jobs and
  // tenants between them.
  ready_.PushFront(key.tenant, key.job, CostOf(all, d.next, d.end), Ready{key, true});
}

bool Coordinator::PacingLocked() const {
  if (options_.batch_window <= 0) return false;
  // Only rank 0's executor says when a batch ran, and only while it runs them all.
  for (const Member& m : generation_.members) {
    if (m.rank == 0) return generation_.formed;
  }
  return false;
}

void Coordinator::ReleaseLocked() {
  const bool pacing = PacingLocked();
  while (!ready_.empty() && (!pacing || static_cast<int>(unran_.size()) < options_.batch_window)) {
    const Ready ready = ready_.Pop();
    if (ready.part) {
      AppendPartLocked(ready.key, /*rest=*/false);
      continue;
    }
    auto it = pending_.find(ready.key);
    // Gone (aborted, or appended already), or a rank was withdrawn meanwhile (it is queued again
    // when it is complete again).
    if (it == pending_.end() || !it->second.queued || !it->second.complete()) continue;
    it->second.queued = false;
    AppendStepLocked(ready.key);
  }
}

void Coordinator::BatchRan(int64_t index) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  while (!unran_.empty() && unran_.front().index <= index) {
    // Its time on the fleet: from when it was appended, or from when the one before it ran.
    const Unran& ran = unran_.front();
    const double seconds = absl::ToDoubleSeconds(now - std::max(ran.at, last_ran_));
    if (ran.cost > 0 && seconds > 0) {
      const double rate = ran.cost / std::max(seconds, 1e-4);
      flops_per_second_ = flops_per_second_ > 0 ? 0.5 * flops_per_second_ + 0.5 * rate : rate;
    }
    unran_.pop_front();
  }
  last_ran_ = now;
  ReleaseLocked();
}

size_t Coordinator::queued_steps() const {
  absl::MutexLock lock(&mu_);
  return ready_.size();
}

void Coordinator::StartReplayLocked(ReadyReport report) {
  const GroupKey key = report.key;
  const int world = report.trainer_world;
  LOG_INFO("fleet") << "step " << key.ToString() << ": trainer rank " << report.trainer_rank << " retries (attempt "
                    << report.attempt << ") a step that was planned before; members' kept inputs stand in for the ranks "
                       "that do not retry";
  Pending& p = NewPendingLocked(key, world);
  const int rank = report.trainer_rank;
  p.reports.emplace(rank, Hold(std::move(report), p.specs));
  FillReplayLocked(key);
}

void Coordinator::FillReplayLocked(const GroupKey& key) {
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
    absl::Status changed = CheckRetryDigestLocked(held.report);
    if (changed.ok() && !OriginalDigestLocked(key, t).has_value()) {
      changed = absl::AbortedError(absl::StrCat(
          "step ", key.ToString(), " of ", RunText(key.run), ": trainer rank ", t,
          " retries a step that ran, but the blocks it ran with are no longer known here, so the retry cannot be "
          "answered from the other ranks' kept inputs"));
    }
    if (!changed.ok()) {
      LOG_WARNING("fleet") << changed;
      RefusedLocked(kStepFailureDigestMismatch);
      ErasePendingLocked(it);
      AppendFailureLocked(key, std::move(changed), false, kStepFailureDigestMismatch);
      return;
    }
  }
  for (int t = 0; t < p.trainer_world; ++t) {
    if (p.report(t) != nullptr) continue;
    for (const Held& holder : kept.holders[t]) {
      // Its inputs are on that rank only while it is the same process and a member.
      if (!IsMemberLocked(holder.report.fleet_rank, holder.report.incarnation)) continue;
      p.reports.emplace(t, holder);
      p.cached.insert(t);
      break;
    }
  }
  if (p.complete()) CompleteLocked(key);
}

Coordinator::Held Coordinator::Hold(ReadyReport report, std::shared_ptr<const SpecList>& shared) {
  auto same = [](const MatrixPlan& a, const MatrixPlan& b) {
    return a.name == b.name && a.shape == b.shape && a.layout == b.layout && a.view == b.view && a.dtype == b.dtype &&
           a.result_dtype == b.result_dtype && a.options == b.options && a.algorithm == b.algorithm &&
           a.partition_dim == b.partition_dim && a.owner == b.owner && a.blocks.empty() && b.blocks.empty();
  };
  Held held;
  if (shared != nullptr &&
      std::equal(report.matrices.begin(), report.matrices.end(), shared->begin(), shared->end(), same)) {
    held.specs = shared;
    report.matrices = SpecList();
  } else {
    held.specs = std::make_shared<const SpecList>(std::move(report.matrices));
    report.matrices = SpecList();
    if (shared == nullptr) shared = held.specs;
  }
  report.blocks.shrink_to_fit();  // Decoded one by one: up to twice the room they need.
  report.step_digests = std::vector<uint64_t>();  // A notice's: taken into ran_, not held W times.
  held.report = std::move(report);
  return held;
}

absl::StatusOr<LogEntry> Coordinator::BuildBatchLocked(const GroupKey& key, Pending& p) {
  const Held& first = *p.report(0);
  const SpecList& first_specs = *first.specs;
  const std::string step = key.ToString();
  for (int r = 1; r < p.trainer_world; ++r) {
    const Held& other = *p.report(r);
    if (other.specs == first.specs) continue;  // One list, held once: identical.
    const SpecList& other_specs = *other.specs;
    if (other_specs.size() != first_specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank 0 sent ", first_specs.size(),
                                                     " matrices but rank ", r, " sent ", other_specs.size(),
                                                     "; every rank must send the same spec list"));
    }
    for (size_t i = 0; i < first_specs.size(); ++i) {
      std::string diff = FirstSpecDifference(first_specs[i], other_specs[i]);
      if (!diff.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("step ", step, ": specs differ between trainer ranks 0 and ", r,
                                                       " at matrix ", i, " (\"", first_specs[i].name, "\"): ", diff));
      }
    }
  }
  // Placements name collective ranks: positions in the generation's member list. Every report
  // here comes from a current member (others were withdrawn when it dropped out).
  std::vector<int> position(options_.fleet_world, -1);
  for (size_t i = 0; i < generation_.members.size(); ++i) position[generation_.members[i].rank] = static_cast<int>(i);
  LogEntry entry;
  entry.key = key;
  BatchPlan& plan = entry.plan;
  plan.trainer_world = p.trainer_world;
  plan.fleet_world = static_cast<int>(generation_.members.size());
  plan.matrices = first_specs;
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    MatrixPlan& m = plan.matrices[i];
    m.blocks.clear();
    m.blocks.reserve(p.trainer_world);
    for (int r = 0; r < p.trainer_world; ++r) {
      const ReadyReport& report = p.report(r)->report;
      m.blocks.push_back(BlockPlacement{r, position[report.fleet_rank], report.blocks[i]});
    }
  }
  for (int r = 0; r < p.trainer_world; ++r) {
    entry.submissions.push_back(p.report(r)->report.submission);
    entry.digests.push_back(p.report(r)->report.digest);
  }
  if (!p.cached.empty()) {
    entry.cached.assign(p.trainer_world, false);
    for (int r : p.cached) entry.cached[r] = true;
  }
  AssignOwners(plan);
  return entry;
}

void Coordinator::WithdrawLocked(Pending& p, int trainer_rank) {
  if (p.reports.erase(trainer_rank) == 0) return;
  p.cached.erase(trainer_rank);
  p.queued = false;  // Its key in ready_ goes stale; complete again, it is queued again.
}

absl::Status Coordinator::Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                                int fleet_rank, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  if (!IsMemberLocked(fleet_rank, incarnation)) {
    return absl::FailedPreconditionError(absl::StrCat("fleet rank ", fleet_rank, " (incarnation ", incarnation,
                                                      ") is not a member of generation ", generation_.number,
                                                      ": its abort of step ", key.ToString(), " is ignored"));
  }
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
      WithdrawLocked(p, trainer_rank);
      if (p.arrived() == 0) ErasePendingLocked(it);
    }
    return absl::OkStatus();
  }
  if (it != pending_.end()) ErasePendingLocked(it);
  divided_.erase(key);  // The parts still to come: the failure below ends the step on every member.
  AppendFailureLocked(key,
                      absl::AbortedError(absl::StrCat("step ", key.ToString(), " aborted: trainer rank ", trainer_rank,
                                                      " failed: ", reason.ToString())),
                      false, reason.code() == absl::StatusCode::kCancelled ? kStepFailureCancelled : kStepFailureAborted);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LogEntry>> Coordinator::Read(const ReaderState& reader, int64_t from,
                                                        absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  RETURN_IF_ERROR(CheckIdentityLocked(reader.rank, reader.epoch, reader.incarnation));
  for (const ReadyReport& r : reader.kept) {
    // Only what this very process keeps, of a group step, newer than what is known.
    if (r.fleet_rank != reader.rank || r.incarnation != reader.incarnation || r.trainer_world < 2 ||
        r.trainer_rank < 0 || r.trainer_rank >= r.trainer_world) {
      continue;
    }
    Kept& kept = kept_[r.key.Group()];
    if (kept.holders.empty() || kept.key.step < r.key.step ||
        static_cast<int>(kept.holders.size()) != r.trainer_world) {
      if (!kept.holders.empty() && kept.key.step > r.key.step) continue;
      kept.key = r.key;
      kept.holders.assign(r.trainer_world, {});
      kept.specs.reset();
    }
    if (!(kept.key == r.key)) continue;
    kept.at = absl::Now();
    if (static_cast<int>(r.step_digests.size()) == r.trainer_world) {
      // The step's digests as its batch carried them: what a coordinator that did not plan it
      // (it restarted since) compares retries with.
      Ran& ran = ran_[r.key.Group()];
      if (ran.digests.empty() || ran.key.step < r.key.step) ran = Ran{r.key, absl::Now(), r.step_digests};
    }
    std::vector<Held>& holders = kept.holders[r.trainer_rank];
    auto same = std::find_if(holders.begin(), holders.end(),
                             [&](const Held& h) { return h.report.fleet_rank == r.fleet_rank; });
    if (same != holders.end()) {
      *same = Hold(r, kept.specs);
    } else {
      holders.push_back(Hold(r, kept.specs));
    }
    FillReplayLocked(r.key);
  }
  {
    Known& k = known_[reader.rank];
    k.last_seen = absl::Now();
    k.cursor = std::max(k.cursor, from);
    if (reader.failed_generation == generation_.number && generation_.number > 0 &&
        k.failed_generation != generation_.number) {
      // Once per generation: a member that cannot join (or lost) this generation's collective
      // makes the next one, without the ranks that are gone by then.
      k.failed_generation = generation_.number;
      LOG_WARNING("fleet") << "fleet rank " << reader.rank << " could not keep generation " << generation_.number
                           << "'s collective; forming the next";
      ScheduleReformLocked("collective_failed", /*force=*/true);
    } else if (reader.formed_generation == generation_.number && k.formed_generation != generation_.number &&
               k.failed_generation != generation_.number) {
      k.formed_generation = generation_.number;
      bool all = true;
      for (const Member& m : generation_.members) all = all && known_[m.rank].formed_generation == generation_.number;
      if (all && !generation_.formed) {
        generation_.formed = true;
        LOG_INFO("fleet") << "generation " << generation_.number << " formed with " << generation_.members.size()
                          << " of " << options_.fleet_world << " ranks";
      }
    }
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (!shutdown_ && first_index_ + static_cast<int64_t>(log_.size()) <= from) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    log_cv_.WaitWithTimeout(&mu_, left + absl::Milliseconds(1));  // The loop rechecks, timed out or not.
  }
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  // It may have been dropped while waiting (silent for too long, or replaced).
  RETURN_IF_ERROR(CheckIdentityLocked(reader.rank, reader.epoch, reader.incarnation));
  known_[reader.rank].last_seen = absl::Now();
  std::vector<LogEntry> out;
  for (int64_t i = std::max(from, first_index_); i < first_index_ + static_cast<int64_t>(log_.size()); ++i) {
    out.push_back(log_[i - first_index_]);
  }
  // Drop what every joined rank has read.
  int64_t keep_from = first_index_ + static_cast<int64_t>(log_.size());
  for (const Known& k : known_) {
    if (k.state == RankState::kJoining || k.state == RankState::kMember || k.state == RankState::kLeaving) {
      keep_from = std::min(keep_from, k.cursor);
    }
  }
  while (!log_.empty() && first_index_ < keep_from) {
    log_.pop_front();
    ++first_index_;
  }
  return out;
}

std::string Coordinator::MissingRanks(const Pending& p) {
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

void Coordinator::CheckPendingLocked(absl::Time now, absl::Time& next) {
  std::vector<GroupKey> expired;
  for (auto& [key, p] : pending_) {
    if (p.queued) continue;  // Complete: it waits for its turn, not for trainer ranks.
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
    Pending& p = pending_[key];
    // A missing rank whose fleet rank dropped out while the step waited was cut off by the
    // fleet change, not by its trainer: a retry may well succeed.
    const bool fleet_changed = p.first_generation != generation_.number;
    absl::Status status = absl::AbortedError(absl::StrCat(
        "step ", key.ToString(), " aborted: rendezvous timeout after ", absl::FormatDuration(options_.rendezvous_timeout),
        ": trainer ranks [", MissingRanks(p), "] of ", p.trainer_world, " did not arrive",
        fleet_changed ? " (the fleet's membership changed meanwhile)" : ""));
    ErasePendingLocked(key);
    AppendFailureLocked(key, std::move(status), fleet_changed, kStepFailureTimeout);
    if (options_.on_rendezvous_timeout) options_.on_rendezvous_timeout();
  }
}

void Coordinator::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Milliseconds(250);
    CheckLivenessLocked(now);
    if (now >= reform_at_) {
      reform_at_ = absl::InfiniteFuture();
      ReformLocked(reform_reason_, reform_forced_);
    } else {
      next = std::min(next, reform_at_);
    }
    CheckPendingLocked(now, next);
    // A batch rank 0 has not reported as run within the rendezvous timeout (its executor is
    // stuck or gone) no longer holds the queue back.
    bool stalled = false;
    while (!unran_.empty() && now - unran_.front().at > options_.rendezvous_timeout) {
      unran_.pop_front();
      stalled = true;
    }
    if (stalled) ReleaseLocked();
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
    timer_cv_.WaitWithTimeout(&mu_, std::max(next - absl::Now(), absl::Milliseconds(1)));  // Either way: go round.
  }
}

}  // namespace orthoserve
