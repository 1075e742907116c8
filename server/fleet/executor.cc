// Implementation of server/fleet/executor.h.
#include "server/fleet/executor.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace orthoserve {

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const Options& options) {
  if (options.backend == nullptr || options.collective == nullptr || options.log == nullptr) {
    return absl::InvalidArgumentError("Executor needs a backend, a collective and a log source");
  }
  return std::unique_ptr<Executor>(new Executor(options));
}

Executor::Executor(const Options& options) : options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

Executor::~Executor() {
  Shutdown();
  if (thread_.joinable()) thread_.join();
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(waiting_);
  }
  for (auto& [key, list] : left) {
    for (Waiting& w : list) {
      StepOutcome outcome;
      outcome.status = absl::UnavailableError(absl::StrCat("step ", key.ToString(), ": the server is shutting down"));
      w.done(std::move(outcome));
    }
  }
}

void Executor::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
}

size_t Executor::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, list] : waiting_) n += list.size();
  return n;
}

void Executor::Submit(std::shared_ptr<TrainerStep> step, StepCallback done) {
  ReadyReport report;
  report.key = step->key;
  report.trainer_rank = step->trainer_rank;
  report.trainer_world = step->trainer_world;
  report.fleet_rank = options_.fleet_rank;
  report.matrices.reserve(step->matrices.size());
  for (const MatrixPlan& m : step->matrices) {
    report.blocks.push_back(m.blocks.empty() ? Block{} : m.blocks[0].block);
    MatrixPlan spec = m;
    spec.blocks.clear();
    report.matrices.push_back(std::move(spec));
  }
  const GroupKey key = step->key;
  const int trainer_rank = step->trainer_rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      StepOutcome outcome;
      outcome.status = absl::UnavailableError("the server is shutting down");
      done(std::move(outcome));
      return;
    }
    waiting_[key].push_back(Waiting{std::move(step), std::move(done)});
  }
  absl::Status reported = options_.log->Report(report);
  if (reported.ok()) return;
  // The coordinator is unreachable: nobody will ever run this step.
  std::vector<Waiting> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiting_.find(key);
    if (it == waiting_.end()) return;
    for (auto w = it->second.begin(); w != it->second.end();) {
      if (w->step->trainer_rank == trainer_rank) {
        mine.push_back(std::move(*w));
        w = it->second.erase(w);
      } else {
        ++w;
      }
    }
    if (it->second.empty()) waiting_.erase(it);
  }
  for (Waiting& w : mine) {
    StepOutcome outcome;
    outcome.status = absl::UnavailableError(absl::StrCat("step ", key.ToString(), ": cannot reach the fleet coordinator: ",
                                                         reported.message()));
    w.done(std::move(outcome));
  }
}

absl::Status Executor::Health(absl::Duration silence) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const absl::Duration quiet = absl::Now() - last_contact_;
  if (quiet > silence) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator's log has been unreachable for ", absl::FormatDuration(quiet)));
  }
  return absl::OkStatus();
}

void Executor::AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason) {
  absl::Status sent = options_.log->Abort(key, trainer_rank, reason);
  if (!sent.ok()) LOG_WARNING("fleet") << "could not report the abort of " << key.ToString() << ": " << sent;
}

void Executor::Loop() {
  int64_t next = 0;
  absl::Duration backoff = absl::Milliseconds(50);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    absl::StatusOr<std::vector<LogEntry>> entries = options_.log->Read(options_.fleet_rank, next, absl::Milliseconds(250));
    if (!entries.ok()) {
      LOG_WARNING("fleet") << "reading the coordinator log failed: " << entries.status();
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
      continue;
    }
    backoff = absl::Milliseconds(50);
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_contact_ = absl::Now();
    }
    for (const LogEntry& entry : *entries) {
      if (entry.index < next) continue;
      next = entry.index + 1;
      Apply(entry);
    }
  }
}

void Executor::Apply(const LogEntry& entry) {
  std::vector<Waiting> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiting_.find(entry.key);
    if (it != waiting_.end()) {
      mine = std::move(it->second);
      waiting_.erase(it);
    }
  }
  const absl::Time start = absl::Now();
  auto finish = [&](StepOutcome outcome) {
    for (Waiting& w : mine) {
      StepOutcome copy = outcome;
      copy.rendezvous_time = start - w.step->submitted;
      w.done(std::move(copy));
    }
  };
  if (!entry.status.ok()) {
    if (options_.metrics != nullptr && !mine.empty()) {
      options_.metrics->StepAborted(entry.status.code() == absl::StatusCode::kAborted ? "aborted" : "invalid");
    }
    StepOutcome outcome;
    outcome.status = entry.status;
    finish(std::move(outcome));
    return;
  }

  // Every fleet rank runs every batch (ranks without blocks take part with empty ones).
  std::vector<LocalBlock> local;
  for (Waiting& w : mine) {
    TrainerStep& s = *w.step;
    s.outputs.assign(s.matrices.size(), {});
    for (size_t i = 0; i < entry.plan.matrices.size() && i < s.matrices.size(); ++i) {
      const MatrixPlan& m = entry.plan.matrices[i];
      const Block& block = m.blocks[s.trainer_rank].block;
      s.outputs[i].resize(static_cast<size_t>(std::max<int64_t>(block.numel(), 0)) * ElementSize(m.result_dtype));
      local.push_back(LocalBlock{static_cast<int>(i), s.trainer_rank, s.inputs[i].data(), s.outputs[i].data()});
    }
  }
  absl::StatusOr<BatchResult> result =
      ExecuteBatch(entry.plan, local, *options_.backend, *options_.collective, options_.execute);
  StepOutcome outcome;
  if (!result.ok()) {
    LOG_ERROR("fleet") << "batch " << entry.key.ToString() << " failed: " << result.status();
    if (options_.metrics != nullptr) options_.metrics->StepAborted("collective");
    outcome.status = absl::UnavailableError(
        absl::StrCat("step ", entry.key.ToString(), " failed in the fleet: ", result.status().ToString()));
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = outcome.status;
  } else {
    outcome.matrices = std::move(result->matrices);
    outcome.collective_time = result->collective_time;
    outcome.compute_time = result->compute_time;
    if (options_.metrics != nullptr) {
      options_.metrics->Flops(result->flops);
      options_.metrics->StageTime(Stage::kCollective, result->collective_time);
      options_.metrics->StageTime(Stage::kCompute, result->compute_time);
    }
  }
  finish(std::move(outcome));
}

}  // namespace orthoserve
