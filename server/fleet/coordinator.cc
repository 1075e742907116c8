// Implementation of server/fleet/coordinator.h.
#include "server/fleet/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "server/fleet/spec_codec.h"

namespace orthoserve {

std::string GroupKey::ToString() const { return absl::StrCat(tenant, "/", job, "/", group, "@", step); }

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const Options& options) {
  if (options.fleet_world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fleet world = ", options.fleet_world, " must be >= 1"));
  }
  if (options.rendezvous_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--rendezvous-timeout must be positive");
  }
  return std::unique_ptr<Coordinator>(new Coordinator(options));
}

Coordinator::Coordinator(const Options& options)
    : options_(options), cursors_(options.fleet_world, 0), last_read_(options.fleet_world, absl::InfinitePast()) {
  timer_ = std::thread([this] { TimerLoop(); });
}

Coordinator::~Coordinator() {
  Shutdown();
  if (timer_.joinable()) timer_.join();
}

void Coordinator::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  log_cv_.notify_all();
  timer_cv_.notify_all();
}

size_t Coordinator::pending_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

void Coordinator::AppendLocked(const GroupKey& key, absl::Status status, BatchPlan plan) {
  LogEntry entry;
  entry.index = first_index_ + static_cast<int64_t>(log_.size());
  entry.key = key;
  entry.status = std::move(status);
  entry.plan = std::move(plan);
  VLOG("fleet", 1) << "log " << entry.index << " " << key.ToString() << " " << entry.status;
  log_.push_back(std::move(entry));
  log_cv_.notify_all();
}

void Coordinator::Report(ReadyReport report) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;
  const GroupKey key = report.key;
  const std::string step = key.ToString();
  if (report.trainer_world < 1 || report.trainer_rank < 0 || report.trainer_rank >= report.trainer_world) {
    pending_.erase(key);
    AppendLocked(key,
                 absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                         " is out of range for world ", report.trainer_world)),
                 {});
    return;
  }
  auto [it, inserted] = pending_.try_emplace(key);
  Pending& p = it->second;
  if (inserted) {
    p.first_report = absl::Now();
    p.trainer_world = report.trainer_world;
    p.reports.resize(report.trainer_world);
    timer_cv_.notify_all();
  }
  if (report.trainer_world != p.trainer_world) {
    int other = 0;
    while (other < p.trainer_world && !p.reports[other]) ++other;
    pending_.erase(it);
    AppendLocked(key,
                 absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                         " says world = ", report.trainer_world, " but rank ", other,
                                                         " said ", p.trainer_world)),
                 {});
    return;
  }
  if (p.reports[report.trainer_rank]) {
    pending_.erase(it);
    AppendLocked(key,
                 absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank ", report.trainer_rank,
                                                         " joined twice (duplicate rank)")),
                 {});
    return;
  }
  const int rank = report.trainer_rank;
  p.reports[rank] = std::move(report);
  if (++p.arrived < p.trainer_world) return;

  absl::StatusOr<BatchPlan> plan = BuildPlanLocked(p);
  pending_.erase(it);
  if (plan.ok()) {
    AppendLocked(key, absl::OkStatus(), std::move(*plan));
  } else {
    AppendLocked(key, plan.status(), {});
  }
}

absl::StatusOr<BatchPlan> Coordinator::BuildPlanLocked(Pending& p) {
  const ReadyReport& first = *p.reports[0];
  const std::string step = first.key.ToString();
  for (int r = 1; r < p.trainer_world; ++r) {
    const ReadyReport& other = *p.reports[r];
    if (other.matrices.size() != first.matrices.size()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step, ": trainer rank 0 sent ", first.matrices.size(),
                                                     " matrices but rank ", r, " sent ", other.matrices.size(),
                                                     "; every rank must send the same spec list"));
    }
    for (size_t i = 0; i < first.matrices.size(); ++i) {
      std::string diff = FirstSpecDifference(first.matrices[i], other.matrices[i]);
      if (!diff.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("step ", step, ": specs differ between trainer ranks 0 and ", r,
                                                       " at matrix ", i, " (\"", first.matrices[i].name, "\"): ", diff));
      }
    }
  }
  BatchPlan plan;
  plan.trainer_world = p.trainer_world;
  plan.fleet_world = options_.fleet_world;
  plan.matrices = first.matrices;
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    MatrixPlan& m = plan.matrices[i];
    m.blocks.clear();
    for (int r = 0; r < p.trainer_world; ++r) {
      const ReadyReport& report = *p.reports[r];
      m.blocks.push_back(BlockPlacement{r, report.fleet_rank, report.blocks[i]});
    }
  }
  AssignOwners(plan);
  return plan;
}

void Coordinator::Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;
  pending_.erase(key);
  AppendLocked(key,
               absl::AbortedError(absl::StrCat("step ", key.ToString(), " aborted: trainer rank ", trainer_rank,
                                               " failed: ", reason.ToString())),
               {});
}

std::vector<int> Coordinator::SilentReaders(absl::Duration silence) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> silent;
  const absl::Time now = absl::Now();
  for (size_t r = 0; r < last_read_.size(); ++r) {
    if (last_read_[r] != absl::InfinitePast() && now - last_read_[r] > silence) silent.push_back(static_cast<int>(r));
  }
  return silent;
}

std::vector<LogEntry> Coordinator::Read(int reader, int64_t from, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + timeout;
  auto available = [&] { return shutdown_ || first_index_ + static_cast<int64_t>(log_.size()) > from; };
  while (!available()) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    log_cv_.wait_for(lock, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  std::vector<LogEntry> out;
  if (shutdown_) return out;
  if (reader >= 0 && reader < static_cast<int>(cursors_.size())) {
    cursors_[reader] = std::max(cursors_[reader], from);
    last_read_[reader] = absl::Now();
  }
  for (int64_t i = std::max(from, first_index_); i < first_index_ + static_cast<int64_t>(log_.size()); ++i) {
    out.push_back(log_[i - first_index_]);
  }
  // Drop what every rank has read.
  const int64_t keep_from = *std::min_element(cursors_.begin(), cursors_.end());
  while (!log_.empty() && first_index_ < keep_from) {
    log_.pop_front();
    ++first_index_;
  }
  return out;
}

void Coordinator::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Seconds(1);
    std::vector<GroupKey> expired;
    for (auto& [key, p] : pending_) {
      const absl::Time deadline = p.first_report + options_.rendezvous_timeout;
      if (now >= deadline) {
        expired.push_back(key);
        continue;
      }
      next = std::min(next, deadline);
      if (!p.warned && now >= p.first_report + options_.stall_warning) {
        p.warned = true;
        std::vector<int> missing;
        for (int r = 0; r < p.trainer_world; ++r) {
          if (!p.reports[r]) missing.push_back(r);
        }
        LOG_WARNING("fleet") << "step " << key.ToString() << " has waited " << (now - p.first_report)
                             << " for trainer ranks [" << absl::StrJoin(missing, ", ") << "] of " << p.trainer_world;
      } else if (!p.warned) {
        next = std::min(next, p.first_report + options_.stall_warning);
      }
    }
    for (const GroupKey& key : expired) {
      Pending& p = pending_[key];
      std::vector<int> missing;
      for (int r = 0; r < p.trainer_world; ++r) {
        if (!p.reports[r]) missing.push_back(r);
      }
      absl::Status status = absl::AbortedError(
          absl::StrCat("step ", key.ToString(), " aborted: rendezvous timeout after ", absl::FormatDuration(options_.rendezvous_timeout),
                       ": trainer ranks [", absl::StrJoin(missing, ", "), "] of ", p.trainer_world, " did not arrive"));
      pending_.erase(key);
      AppendLocked(key, std::move(status), {});
      if (options_.on_rendezvous_timeout) options_.on_rendezvous_timeout();
    }
    timer_cv_.wait_for(lock, absl::ToChronoMilliseconds(std::max(next - absl::Now(), absl::Milliseconds(1))));
  }
}

}  // namespace orthoserve
