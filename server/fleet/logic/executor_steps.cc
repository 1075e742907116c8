// Steps half of server/fleet/logic/executor.h: submitting trainer steps and running the batches and
// failures the log decides for them.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/block_digest.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/fleet/logic/executor.h"

namespace orthoserve {
namespace {

// The `reason` of orthoserve_steps_aborted_total for a failure entry: the coordinator's, or, from
// a coordinator that predates LogEntry::failure, the closest one its status code allows.
const char* FailureReason(const LogEntry& entry) {
  for (const char* known : {kStepFailureTimeout, kStepFailureCancelled, kStepFailureAborted, kStepFailureInvalid,
                            kStepFailureRunMismatch, kStepFailureDigestMismatch, kStepFailureLimit}) {
    if (entry.failure == known) return known;
  }
  return entry.status.code() == absl::StatusCode::kAborted ? kStepFailureAborted : kStepFailureInvalid;
}

}  // namespace

ReadyReport Executor::ReportOf(const TrainerStep& step) const {
  ReadyReport report;
  report.key = step.key;
  report.trainer_rank = step.trainer_rank;
  report.trainer_world = step.trainer_world;
  report.fleet_rank = options_.self.rank;
  report.attempt = step.attempt;
  report.incarnation = options_.self.incarnation;
  report.submission = step.submission;
  report.digest = step.digest;
  report.sent = step.sent;  // The shared specs, and this rank's blocks.
  report.region_spans = step.region_spans;
  return report;
}

void Executor::Submit(std::shared_ptr<TrainerStep> step, StepCallback done) {
  const GroupKey key = step->key;
  ReadyReport report;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      done(Unavailable(key, "the server is shutting down"));
      return;
    }
    step->submission = next_submission_++;
    if (!joined_ || !FormedLocked()) {
      if (options_.formation_hold <= absl::ZeroDuration() || leaving_) {
        done(Unavailable(key, absl::StrCat("fleet rank ", options_.self.rank,
                                           " is not a member of a formed fleet generation; retry on a ready member")));
        return;
      }
      held_.push_back(Held{Waiting{std::move(step), std::move(done)}, absl::Now() + options_.formation_hold});
      return;
    }
    report = ListLocked(Waiting{std::move(step), std::move(done)});
  }
  SendReport(report);
}

bool Executor::TakesSteps() const {
  absl::MutexLock lock(&mu_);
  if (stopping_ || leaving_) return false;
  return (joined_ && FormedLocked()) || options_.formation_hold > absl::ZeroDuration();
}

ReadyReport Executor::ListLocked(Waiting waiting) {
  ReadyReport report = ReportOf(*waiting.step);
  report.epoch = epoch_;
  waiting_[waiting.step->key].push_back(std::move(waiting));
  return report;
}

void Executor::SendReport(const ReadyReport& report) {
  absl::Status reported = options_.log->Report(report);
  if (reported.ok()) return;
  // The coordinator did not take it: nobody will ever run this submission.
  std::vector<Waiting> mine;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiting_.find(report.key);
    if (it == waiting_.end()) return;  // Resolved meanwhile (a reset failed it).
    for (auto w = it->second.begin(); w != it->second.end();) {
      if (w->step->submission == report.submission) {
        mine.push_back(std::move(*w));
        w = it->second.erase(w);
      } else {
        ++w;
      }
    }
    if (it->second.empty()) waiting_.erase(it);
  }
  for (Waiting& w : mine) {
    w.done(Unavailable(report.key, absl::StrCat("the fleet coordinator did not take the report: ", reported.message())));
  }
}

void Executor::ReleaseHeld() {
  std::vector<ReadyReport> reports;
  {
    absl::MutexLock lock(&mu_);
    if (!joined_ || !FormedLocked()) return;
    for (Held& h : held_) reports.push_back(ListLocked(std::move(h.waiting)));
    held_.clear();
  }
  if (!reports.empty()) VLOG("fleet", 1) << "reporting " << reports.size() << " steps held for the new generation";
  for (const ReadyReport& r : reports) SendReport(r);
}

void Executor::ExpireHeld() {
  std::vector<Waiting> expired;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto h = held_.begin(); h != held_.end();) {
      if (h->until <= now) {
        expired.push_back(std::move(h->waiting));
        h = held_.erase(h);
      } else {
        ++h;
      }
    }
  }
  for (Waiting& w : expired) {
    w.done(Unavailable(w.step->key, absl::StrCat("fleet rank ", options_.self.rank, " did not become a member of a formed "
                                                 "fleet generation within ", absl::FormatDuration(options_.formation_hold),
                                                 "; retry on a ready member")));
  }
}

void Executor::TakeHeldLocked(absl::flat_hash_map<GroupKey, std::vector<Waiting>>& into) {
  for (Held& h : held_) into[h.waiting.step->key].push_back(std::move(h.waiting));
  held_.clear();
}

void Executor::AdvertiseLocked(const CachedBatch& batch, const std::vector<std::shared_ptr<TrainerStep>>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    advertise_.push_back(ReportOf(*steps[i]));
    if (i == 0) advertise_.back().step_digests = batch.digests;
  }
}

void Executor::Keep(const LogEntry& entry, const std::vector<std::shared_ptr<TrainerStep>>& steps) {
  const GroupKey& key = entry.key;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (now - it->second.at > options_.cache_ttl) {
      cache_.erase(it++);
    } else {
      ++it;
    }
  }
  // The group's previous step is dropped: its next one ran, so every trainer rank has its result.
  // Another run of the same step (a replay) adds to what is kept: a trainer rank placed
  // elsewhere this time is still kept here, as the coordinator was told, and a trainer rank that
  // ran here again under a new submission is kept under both: a replay the coordinator planned
  // before this run's notice reached it names the older submission (CachedStepsLocked matches
  // submissions), and both carry the same blocks (a retry's digest must equal its original's).
  CachedBatch& batch = cache_[key.Group()];
  if (!(batch.key == key)) {
    batch.key = key;
    batch.steps.clear();
  }
  batch.at = now;
  if (!entry.digests.empty()) batch.digests = entry.digests;
  for (const std::shared_ptr<TrainerStep>& s : steps) {
    auto same = std::find_if(batch.steps.begin(), batch.steps.end(), [&](const std::shared_ptr<TrainerStep>& k) {
      return k->trainer_rank == s->trainer_rank && k->submission == s->submission;
    });
    if (same != batch.steps.end()) {
      *same = s;
    } else {
      batch.steps.push_back(s);
    }
  }
  AdvertiseLocked(batch, steps);
}

absl::StatusOr<std::vector<std::shared_ptr<TrainerStep>>> Executor::CopyToNextMember(
    const LogEntry& entry, const BatchResult& result, const std::vector<std::shared_ptr<TrainerStep>>& here,
    Collective& collective) {
  std::vector<std::shared_ptr<TrainerStep>> copies;
  const BatchPlan& plan = entry.plan;
  const int members = plan.fleet_world;
  const int world = plan.trainer_world;
  if (world < 2 || members < 2 || plan.matrices.empty()) return copies;
  for (const absl::Status& s : result.matrices) {
    if (!s.ok()) return copies;  // Agreed on every rank; a replay would fail the same way.
  }
  // Trainer ranks by the member they ran on; a member running one needs no copy (if it dies
  // before that rank has its result, nobody else has it yet either: everyone retries).
  std::vector<std::vector<int>> on(members);
  for (int t = 0; t < world; ++t) {
    const int q = plan.matrices[0].blocks[t].fleet_rank;
    if (q >= 0 && q < members) on[q].push_back(t);
  }
  auto bytes_of = [&](int q) {
    size_t n = 0;
    if (on[q].size() < 2) return n;
    for (int t : on[q]) {
      for (const MatrixPlan& m : plan.matrices) {
        n += static_cast<size_t>(std::max<int64_t>(m.blocks[t].block.numel(), 0)) * ElementSize(m.dtype);
      }
    }
    return n;
  };
  bool any = false;
  for (int q = 0; q < members; ++q) any = any || on[q].size() >= 2;
  if (!any) return copies;
  const int me = collective.rank();
  const int next = (me + 1) % members;
  const int prev = (me + members - 1) % members;
  std::vector<size_t> send_bytes(members, 0), recv_bytes(members, 0);
  send_bytes[next] = bytes_of(me);
  recv_bytes[prev] = bytes_of(prev);
  std::vector<char> send, recv(recv_bytes[prev]);
  send.reserve(send_bytes[next]);
  if (send_bytes[next] > 0) {
    for (int t : on[me]) {
      auto s = std::find_if(here.begin(), here.end(), [t](const auto& step) { return step->trainer_rank == t; });
      if (s == here.end()) return absl::InternalError(absl::StrCat("trainer rank ", t, "'s step is not on this rank"));
      for (size_t i = 0; i < plan.matrices.size(); ++i) {
        const absl::string_view in = (*s)->input(i);
        send.insert(send.end(), in.begin(), in.end());
      }
    }
    if (send.size() != send_bytes[next]) return absl::InternalError("the inputs kept here do not match their blocks");
  }
  RETURN_IF_ERROR(collective.AllToAllv(send.data(), send_bytes, recv.data(), recv_bytes,
                                       options_.execute.collective_timeout));
  if (recv_bytes[prev] == 0) return copies;
  // One spec list for every copy: the plan's, placements and owners cleared.
  SpecList list = plan.matrices;
  for (MatrixPlan& m : list) {
    m.blocks.clear();
    m.owner = -1;
  }
  const SharedSpecs specs = std::make_shared<const SpecList>(std::move(list));
  size_t offset = 0;
  for (int t : on[prev]) {
    auto step = std::make_shared<TrainerStep>();
    step->key = entry.key;
    step->trainer_rank = t;
    step->trainer_world = world;
    step->submission = entry.submissions[t];
    std::vector<DigestedBlock> digested;
    digested.reserve(plan.matrices.size());
    std::vector<Block> blocks;
    blocks.reserve(plan.matrices.size());
    for (const MatrixPlan& m : plan.matrices) {
      blocks.push_back(m.blocks[t].block);
      const size_t n = static_cast<size_t>(std::max<int64_t>(m.blocks[t].block.numel(), 0)) * ElementSize(m.dtype);
      step->inputs.emplace_back(recv.begin() + static_cast<std::ptrdiff_t>(offset),
                                recv.begin() + static_cast<std::ptrdiff_t>(offset + n));
      offset += n;
      // The copy's digest, as the member that received the blocks from the trainer made it (the
      // log does not carry digests): what a replay compares a retry of this rank with.
      StreamDigest bytes;
      bytes.Update(absl::string_view(step->inputs.back().data(), step->inputs.back().size()));
      digested.push_back(DigestedBlock{m.blocks[t].block, m.dtype, bytes.Value()});
    }
    step->sent = SenderBlocks(specs, std::move(blocks));
    step->digest = StepDigest(digested);
    if (static_cast<size_t>(t) < entry.digests.size() && entry.digests[t] != step->digest) {
      // Not the blocks the batch ran with (a trainer changed its shared-memory inputs during the
      // step): a replay from this copy would answer a retry with a result of other inputs.
      LOG_WARNING("fleet") << "step " << entry.key.ToString() << ": the copy of trainer rank " << t
                           << "'s inputs is not what the batch ran with; not kept for replays";
      continue;
    }
    copies.push_back(std::move(step));
  }
  return copies;
}

void Executor::ApplyStep(const LogEntry& entry) {
  ClaimedStep claimed = ClaimStep(entry);
  if (ResolveUnrunnable(entry, claimed)) return;
  // Every member runs every batch (ranks without blocks take part with empty ones).
  std::vector<LocalBlock> local = OwnBlocks(entry, claimed.mine);
  std::vector<std::vector<char>> scratch;  // A replay's results computed again, dropped.
  AddReplayBlocks(entry, claimed.cached, scratch, local);
  absl::StatusOr<BatchResult> result = RunBatch(entry, local, *claimed.collective);
  if (result.ok() && claimed.partial.has_value() && AddPart(entry, *result, claimed)) return;
  LogEntry whole;
  const LogEntry& step_entry = WholeStep(entry, result, claimed, whole);
  if (result.ok()) OwnRegionInputs(entry.key, claimed);
  const std::vector<std::shared_ptr<TrainerStep>> copies = CopyForReplay(step_entry, result, claimed);
  const StepOutcome outcome = Outcome(entry, result, claimed, copies);
  Resolve(claimed.mine, outcome, claimed.start);
}

Executor::ClaimedStep Executor::ClaimStep(const LogEntry& entry) {
  ClaimedStep claimed;
  {
    absl::MutexLock lock(&mu_);
    ClaimWaitingLocked(entry, claimed);
    OpenPartLocked(entry, claimed);
    claimed.collective = collective_;
    claimed.usable = FormedLocked() && entry.generation == generation_;
    claimed.cached = CachedStepsLocked(entry);
  }
  claimed.start = claimed.partial.has_value() ? claimed.partial->start : absl::Now();
  return claimed;
}

void Executor::ClaimWaitingLocked(const LogEntry& entry, ClaimedStep& claimed) {
  auto it = waiting_.find(entry.key);
  if (it == waiting_.end()) return;
  // Only the submissions the plan was made from take part; another submission of the same
  // trainer rank here was superseded by a retry (its client has gone). A failure entry ends all.
  // But where a replay takes a trainer rank's kept inputs (entry.cached), a submission of that
  // rank waiting here is its retry, newer than the replay: the replay its report starts (next in
  // the log) runs it, so it keeps waiting.
  std::vector<Waiting> later;
  for (Waiting& w : it->second) {
    const int r = w.step->trainer_rank;
    const bool in_range = r >= 0 && r < static_cast<int>(entry.submissions.size());
    const bool planned = !entry.status.ok() || (in_range && entry.submissions[r] == w.step->submission);
    if (!planned && in_range && static_cast<size_t>(r) < entry.cached.size() && entry.cached[r]) {
      later.push_back(std::move(w));
      continue;
    }
    (planned ? claimed.mine : claimed.stale).push_back(std::move(w));
  }
  if (later.empty()) {
    waiting_.erase(it);
  } else {
    it->second = std::move(later);
  }
}

void Executor::OpenPartLocked(const LogEntry& entry, ClaimedStep& claimed) {
  const bool divided = entry.more_parts || entry.part_offset > 0;
  // A divided step's steps wait in its parts_ record between its parts (after its first part,
  // they are taken from there, not from waiting_); a first part starts a new record, a failure
  // entry ends it.
  auto p = parts_.find(entry.key);
  if (p != parts_.end()) {
    // A first part over an old record starts the step's parts anew: the old record's steps were
    // superseded by the retries this run was planned from.
    const bool anew = entry.status.ok() && divided && entry.part_offset == 0;
    for (Waiting& w : p->second.steps) (anew ? claimed.stale : claimed.mine).push_back(std::move(w));
    p->second.steps.clear();
    if (entry.status.ok() && divided && entry.part_offset > 0) claimed.partial = std::move(p->second);
    parts_.erase(p);
  }
  if (entry.status.ok() && divided && !claimed.partial.has_value()) {
    claimed.partial.emplace(PartialStep{});
    claimed.partial->start = absl::Now();
    // A rank that lost its record (or joined mid-way) cannot complete the step's results.
    claimed.partial->complete = entry.part_offset == 0;
  }
}

std::vector<std::shared_ptr<TrainerStep>> Executor::CachedStepsLocked(const LogEntry& entry) const {
  std::vector<std::shared_ptr<TrainerStep>> cached;
  auto c = entry.cached.empty() ? cache_.end() : cache_.find(entry.key.Group());
  if (c != cache_.end() && c->second.key == entry.key && !entry.plan.matrices.empty()) {
    for (const std::shared_ptr<TrainerStep>& s : c->second.steps) {
      const size_t r = static_cast<size_t>(s->trainer_rank);
      // Only where the plan takes it from: another member may keep a copy of the same step.
      if (r < entry.cached.size() && entry.cached[r] && entry.submissions[r] == s->submission &&
          entry.plan.matrices[0].blocks[r].fleet_rank == collective_rank_) {
        cached.push_back(s);
      }
    }
  }
  return cached;
}

bool Executor::ResolveUnrunnable(const LogEntry& entry, ClaimedStep& claimed) {
  if (!entry.status.ok()) {
    if (options_.metrics != nullptr && !claimed.mine.empty()) options_.metrics->StepAborted(FailureReason(entry));
    StepOutcome outcome;
    outcome.status = entry.status;
    Resolve(claimed.mine, outcome, claimed.start);
    return true;
  }
  Resolve(claimed.stale, Unavailable(entry.key, "superseded by a retry of the same trainer rank"), claimed.start);
  if (!claimed.usable) {
    // Planned for a generation this rank does not hold (it changed, or its group broke):
    // nobody can run it with the others.
    if (options_.metrics != nullptr && !claimed.mine.empty()) options_.metrics->StepAborted("fleet_change");
    Resolve(claimed.mine,
            Unavailable(entry.key, absl::StrCat("the fleet's generation changed (planned in ", entry.generation,
                                                ") before it ran")),
            claimed.start);
    return true;
  }
  return false;
}

std::vector<LocalBlock> Executor::OwnBlocks(const LogEntry& entry, std::vector<Waiting>& mine) {
  // Matrix i of a part is matrix part_offset + i of its steps.
  const size_t offset = static_cast<size_t>(entry.part_offset);
  std::vector<LocalBlock> local;
  for (Waiting& w : mine) {
    TrainerStep& s = *w.step;
    if (offset == 0) s.outputs.assign(s.sent.size(), {});
    for (size_t i = 0; i < entry.plan.matrices.size() && offset + i < s.sent.size(); ++i) {
      const MatrixPlan& m = entry.plan.matrices[i];
      // A later part of another trainer world (a coordinator's error) has no block for this
      // rank: AddPart marks the step incomplete, and it fails.
      if (static_cast<size_t>(s.trainer_rank) >= m.blocks.size()) break;
      const Block& block = m.blocks[s.trainer_rank].block;
      // A block in the trainer's regions is read there and its result written there (this
      // submission's slices: a retry's, when a replay runs it).
      char* out = s.output_in_region(offset + i);
      if (out == nullptr) {
        s.outputs[offset + i].resize(static_cast<size_t>(std::max<int64_t>(block.numel(), 0)) *
                                     ElementSize(m.result_dtype));
        out = s.outputs[offset + i].data();
      }
      local.push_back(LocalBlock{static_cast<int>(i), s.trainer_rank, s.input(offset + i).data(), out});
    }
  }
  return local;
}

void Executor::AddReplayBlocks(const LogEntry& entry, const std::vector<std::shared_ptr<TrainerStep>>& cached,
                               std::vector<std::vector<char>>& scratch, std::vector<LocalBlock>& local) {
  // A replay (never divided): the kept inputs of ranks that already have their results; what
  // they compute again goes to scratch buffers (it is the same).
  for (const std::shared_ptr<TrainerStep>& s : cached) {
    for (size_t i = 0; i < entry.plan.matrices.size() && i < s->sent.size(); ++i) {
      const MatrixPlan& m = entry.plan.matrices[i];
      const Block& block = m.blocks[s->trainer_rank].block;
      scratch.emplace_back(static_cast<size_t>(std::max<int64_t>(block.numel(), 0)) * ElementSize(m.result_dtype));
    }
  }
  size_t next_scratch = 0;
  for (const std::shared_ptr<TrainerStep>& s : cached) {
    for (size_t i = 0; i < entry.plan.matrices.size() && i < s->sent.size(); ++i) {
      local.push_back(
          LocalBlock{static_cast<int>(i), s->trainer_rank, s->input(i).data(), scratch[next_scratch++].data()});
    }
  }
}

absl::StatusOr<BatchResult> Executor::RunBatch(const LogEntry& entry, const std::vector<LocalBlock>& local,
                                               Collective& collective) {
  absl::StatusOr<BatchResult> result = ExecuteBatch(entry.plan, local, *options_.backend, collective, options_.execute);
  if (result.ok() && options_.metrics != nullptr) {
    options_.metrics->Flops(result->flops);
    options_.metrics->StageTime(Stage::kCollective, result->collective_time);
    options_.metrics->StageTime(Stage::kCompute, result->compute_time);
  }
  return result;
}

bool Executor::AddPart(const LogEntry& entry, const BatchResult& result, ClaimedStep& claimed) {
  PartialStep* partial = &*claimed.partial;
  // Parts of one step share its trainer world (the whole step's placements are indexed by it).
  partial->complete = partial->complete && static_cast<size_t>(entry.part_offset) == partial->plan.matrices.size() &&
                      (partial->plan.matrices.empty() || partial->plan.trainer_world == entry.plan.trainer_world);
  partial->plan.trainer_world = entry.plan.trainer_world;
  partial->plan.fleet_world = entry.plan.fleet_world;
  partial->plan.matrices.insert(partial->plan.matrices.end(), entry.plan.matrices.begin(), entry.plan.matrices.end());
  partial->result.matrices.insert(partial->result.matrices.end(), result.matrices.begin(), result.matrices.end());
  partial->result.collective_time += result.collective_time;
  partial->result.compute_time += result.compute_time;
  if (!entry.more_parts) return false;
  // A part before the last: its results wait in the steps' outputs for the rest, and the record
  // goes back to parts_ — unless the executor is stopping, whose Shutdown could not fail steps
  // that were out here.
  partial->steps = std::move(claimed.mine);
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> left;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      parts_[entry.key] = *std::move(claimed.partial);
      claimed.partial.reset();
      return true;
    }
    left[entry.key] = std::move(partial->steps);
  }
  FailAll(left, "the server is shutting down");
  return true;
}

const LogEntry& Executor::WholeStep(const LogEntry& entry, absl::StatusOr<BatchResult>& result,
                                    ClaimedStep& claimed, LogEntry& whole) {
  if (!result.ok() || !claimed.partial.has_value()) return entry;
  PartialStep* partial = &*claimed.partial;
  if (!partial->complete) {
    result = absl::InternalError(absl::StrCat("this rank did not run every part of the step (",
                                              partial->plan.matrices.size(), " matrices from offset ",
                                              entry.part_offset, ")"));
    return entry;
  }
  whole = entry;
  whole.plan = std::move(partial->plan);
  whole.part_offset = 0;
  result->matrices = std::move(partial->result.matrices);
  result->collective_time = partial->result.collective_time;
  result->compute_time = partial->result.compute_time;
  return whole;
}

void Executor::OwnRegionInputs(const GroupKey& key, ClaimedStep& claimed) {
  for (const Waiting& w : claimed.mine) {
    if (TakeRegionInputs(*w.step)) continue;
    LOG_WARNING("fleet") << "step " << key.ToString() << ": trainer rank " << w.step->trainer_rank
                         << " changed its shared-memory inputs during the step; it is not kept for replays";
    claimed.changed.push_back(w.step);
  }
}

std::vector<std::shared_ptr<TrainerStep>> Executor::CopyForReplay(const LogEntry& step_entry,
                                                                  absl::StatusOr<BatchResult>& result,
                                                                  const ClaimedStep& claimed) {
  std::vector<std::shared_ptr<TrainerStep>> copies;  // Steps of the previous member, kept here too.
  if (!result.ok()) return copies;
  std::vector<std::shared_ptr<TrainerStep>> here = claimed.cached;
  for (const Waiting& w : claimed.mine) here.push_back(w.step);
  absl::StatusOr<std::vector<std::shared_ptr<TrainerStep>>> copied =
      CopyToNextMember(step_entry, *result, here, *claimed.collective);
  if (copied.ok()) {
    copies = *std::move(copied);
  } else {
    result = copied.status();  // Results are withheld: no rank has them without the copies.
  }
  return copies;
}

StepOutcome Executor::Outcome(const LogEntry& entry, absl::StatusOr<BatchResult>& result, ClaimedStep& claimed,
                              const std::vector<std::shared_ptr<TrainerStep>>& copies) {
  StepOutcome outcome;
  if (!result.ok()) {
    LOG_ERROR("fleet") << "batch " << entry.key.ToString() << " failed in generation " << entry.generation << ": "
                       << result.status();
    if (options_.metrics != nullptr && !claimed.mine.empty()) options_.metrics->StepAborted("collective");
    outcome = Unavailable(entry.key, absl::StrCat("failed in the fleet: ", result.status().ToString()));
    // The group is broken for good: report the generation failed so that the next one forms.
    absl::MutexLock lock(&mu_);
    if (generation_ == entry.generation) {
      failed_generation_ = entry.generation;
      collective_.reset();
      PublishMetricsLocked();
    }
  } else {
    outcome.matrices = std::move(result->matrices);
    outcome.collective_time = result->collective_time;
    outcome.compute_time = result->compute_time;
    if (entry.plan.trainer_world > 1 && (!claimed.mine.empty() || !claimed.cached.empty() || !copies.empty())) {
      std::vector<std::shared_ptr<TrainerStep>> keep = claimed.cached;
      keep.insert(keep.end(), copies.begin(), copies.end());
      for (const Waiting& w : claimed.mine) {
        const bool changed = std::find(claimed.changed.begin(), claimed.changed.end(), w.step) != claimed.changed.end();
        if (!changed) keep.push_back(w.step);
      }
      Keep(entry, keep);
    }
  }
  return outcome;
}

void Executor::Resolve(std::vector<Waiting>& steps, const StepOutcome& outcome, absl::Time start) {
  for (Waiting& w : steps) {
    StepOutcome copy = outcome;
    copy.rendezvous_time = start - w.step->submitted;
    w.done(std::move(copy));
  }
}

}  // namespace orthoserve
