// The fleet harness of the executor's tests: S executors as threads over one in-process
// coordinator (reached through FreezableLog), Gloo on loopback and the CPU backend, and the
// trainer steps of one row-sharded matrix that the tests submit to them.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/gloo/gloo_collective.h"
#include "server/collective/in_memory_store.h"
#include "server/collective/local_collective.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/logic/executor.h"
#include "tests/unit/fleet/trainer_step_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {

constexpr absl::Duration kPeer = absl::Milliseconds(600);
constexpr absl::Duration kCollective = absl::Seconds(60);  // Far longer than any test may wait.

// The coordinator in this process, as rank `rank` reaches it; Freeze() makes every call hang
// (bounded by its timeout) and fail, as a stopped process's calls would never arrive; Point()
// sends later calls to another coordinator (a restarted one).
class FreezableLog final : public LogSource {
 public:
  explicit FreezableLog(Coordinator* c) : coordinator_(c) {}
  void Freeze(bool frozen) { frozen_.store(frozen); }
  void Point(Coordinator* c) { coordinator_.store(c); }

  absl::StatusOr<Joined> Join(const Member& me) override {
    RETURN_IF_ERROR(Gate(absl::Milliseconds(100)));
    return Local().Join(me);
  }
  absl::Status Leave(int rank, uint64_t incarnation, uint64_t epoch) override {
    RETURN_IF_ERROR(Gate(absl::Milliseconds(100)));
    return Local().Leave(rank, incarnation, epoch);
  }
  absl::Status Report(const ReadyReport& report) override {
    RETURN_IF_ERROR(Gate(absl::Milliseconds(100)));
    return Local().Report(report);
  }
  absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                     int fleet_rank, uint64_t incarnation) override {
    RETURN_IF_ERROR(Gate(absl::Milliseconds(100)));
    return Local().Abort(key, trainer_rank, reason, submission, fleet_rank, incarnation);
  }
  absl::StatusOr<std::vector<LogEntry>> Read(const ReaderState& reader, int64_t from, absl::Duration timeout) override {
    RETURN_IF_ERROR(Gate(timeout));
    absl::StatusOr<std::vector<LogEntry>> entries = Local().Read(reader, from, timeout);
    // A read in flight when the process stopped is never seen by it.
    if (frozen_.load()) return absl::UnavailableError("frozen");
    return entries;
  }

 private:
  absl::Status Gate(absl::Duration wait) {
    if (!frozen_.load()) return absl::OkStatus();
    absl::SleepFor(wait);
    return absl::UnavailableError("frozen");
  }
  LocalLogSource Local() { return LocalLogSource(coordinator_.load()); }
  std::atomic<Coordinator*> coordinator_;
  std::atomic<bool> frozen_{false};
};

class FleetHarness {
 public:
  // `batch_window` and `part_time`: the coordinator's order of batches (0: as steps complete).
  explicit FleetHarness(int world, int batch_window = 0, absl::Duration part_time = absl::ZeroDuration())
      : world_(world), batch_window_(batch_window), part_time_(part_time), store_(std::make_shared<InMemoryStore>()) {
    coordinator_ = NewCoordinator();
    backend_ = *CpuBackend::Create({});
    logs_.resize(world);
    ranks_.resize(world);
    on_membership_.resize(world);
    for (int r = 0; r < world; ++r) logs_[r] = std::make_unique<FreezableLog>(coordinator_.get());
  }
  ~FleetHarness() {
    for (auto& e : ranks_) e.reset();
    coordinator_->Shutdown();
    for (auto& old : retired_) old->Shutdown();
  }

  // A new coordinator process (a new epoch, nothing of the old one's state) in place of the old.
  void RestartCoordinator() {
    std::unique_ptr<Coordinator> fresh = NewCoordinator();
    for (auto& log : logs_) log->Point(fresh.get());
    coordinator_->Shutdown();
    retired_.push_back(std::move(coordinator_));  // Calls in flight may still use it.
    coordinator_ = std::move(fresh);
  }

  void Start(int rank) {
    ranks_[rank].reset();
    Executor::Options o;
    o.self = Member{rank, absl::StrCat("rank", rank), next_incarnation_++};
    o.backend = backend_.get();
    o.log = logs_[rank].get();
    o.execute.collective_timeout = kCollective;
    o.peer_timeout = kPeer;
    o.formation_timeout = absl::Seconds(10);
    o.poll = absl::Milliseconds(50);
    o.formation_hold = hold_;
    if (rank == 0 && batch_window_ > 0) {
      o.on_step_applied = [this](int64_t index) {
        const int applied = ++steps_applied_on_0_;
        if (on_applied_by_0_) on_applied_by_0_(applied);
        coordinator_->BatchRan(index);
      };
    }
    o.on_membership = on_membership_[rank];
    std::shared_ptr<Store> store = store_;
    o.join_collective = [store, rank, refuse = refuse_join_](
                            const CollectiveGroup& g, absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Collective>> {
      if (refuse && refuse(rank, g)) {
        return absl::UnavailableError(absl::StrCat("rank ", rank, " cannot reach a peer's collective port"));
      }
      if (g.world == 1) return std::unique_ptr<Collective>(std::make_unique<LocalCollective>());
      GlooCollective::Options go;
      go.rank = g.index;
      go.world = g.world;
      go.store = store.get();
      go.prefix = g.prefix;
      go.timeout = std::max(deadline - absl::Now(), absl::Milliseconds(1));
      ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> gloo, GlooCollective::Create(go));
      return std::unique_ptr<Collective>(std::move(gloo));
    };
    ranks_[rank] = *Executor::Create(o);
  }
  void StartAll() {
    for (int r = 0; r < world_; ++r) Start(r);
  }
  // Stops a rank without a goodbye (its process died).
  void Kill(int rank) { ranks_[rank].reset(); }
  Executor& rank(int r) { return *ranks_[r]; }
  FreezableLog& log(int r) { return *logs_[r]; }
  Coordinator& coordinator() { return *coordinator_; }
  Backend& backend() { return *backend_; }
  // Step entries of the log (batches, parts, failures) rank 0 has applied.
  int steps_applied_on_0() const { return steps_applied_on_0_.load(); }
  // Runs with the count after each step entry rank 0 applies, before the coordinator hears of it
  // (so before a paced coordinator appends the next batch). Set before Start(0).
  void OnAppliedByZero(std::function<void(int)> f) { on_applied_by_0_ = std::move(f); }
  // Makes joining a generation's collective fail at once on rank `rank` when `refuse(rank, group)`
  // (a partial partition). Set before Start.
  void RefuseJoin(std::function<bool(int rank, const CollectiveGroup&)> refuse) { refuse_join_ = std::move(refuse); }
  // Executor::Options::formation_hold of the ranks started from now on (zero unless set).
  void Hold(absl::Duration hold) { hold_ = hold; }
  // Executor::Options::on_membership of rank `rank` (set before Start(rank)).
  void OnMembership(int rank, std::function<void(const std::vector<Member>&, bool)> f) {
    on_membership_[rank] = std::move(f);
  }

  // Waits (bounded) until a generation of exactly `ranks` is formed on each of them.
  bool WaitFormed(const std::vector<int>& ranks, absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      bool all = true;
      for (int r : ranks) {
        Executor::View v = ranks_[r]->view();
        all = all && v.formed && v.members.size() == ranks.size();
      }
      if (all) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  // WaitFormed, and then until the coordinator has heard that the generation formed (from the
  // members' next reads): from then on it paces batches (and divides steps into parts).
  bool WaitPaced(const std::vector<int>& ranks) {
    if (!WaitFormed(ranks)) return false;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!coordinator_->generation().formed && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    return coordinator_->generation().formed;
  }

 private:
  std::unique_ptr<Coordinator> NewCoordinator() const {
    Coordinator::Options c;
    c.fleet_world = world_;
    c.peer_timeout = kPeer;
    c.reform_delay = absl::Milliseconds(50);
    c.batch_window = batch_window_;
    c.part_time = part_time_;
    c.quarantine_base = absl::Seconds(2);
    return *Coordinator::Create(c);
  }

  const int world_;
  const int batch_window_;
  const absl::Duration part_time_;
  std::atomic<int> steps_applied_on_0_{0};
  std::function<void(int)> on_applied_by_0_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::unique_ptr<Coordinator>> retired_;
  std::unique_ptr<Backend> backend_;
  std::vector<std::unique_ptr<FreezableLog>> logs_;
  std::vector<std::unique_ptr<Executor>> ranks_;
  std::vector<std::function<void(const std::vector<Member>&, bool)>> on_membership_;
  std::function<bool(int rank, const CollectiveGroup&)> refuse_join_;
  absl::Duration hold_ = absl::ZeroDuration();
  uint64_t next_incarnation_ = 1;
};

constexpr int kRows = 24;
constexpr int kCols = 16;

inline std::vector<float> RandomMatrix(int seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> m(kRows * kCols);
  for (float& v : m) v = dist(gen);
  return m;
}

inline NsOptions Highest() {
  NsOptions o;
  o.precision = Precision::kHighest;
  return o;
}

// Trainer rank `r` of `world`'s row block of `full` as a step (AUTO, HIGHEST).
inline std::shared_ptr<TrainerStep> MakeStep(const GroupKey& key, int r, int world, const std::vector<float>& full,
                                      int attempt = 0) {
  return testing::RowBlockStep(key, r, world, kRows, kCols, full, Highest(), Algorithm::kAuto, attempt);
}

// Submits each trainer rank's step to the executor of fleet rank `placement[r]`; returns the
// outcomes in trainer rank order.
inline std::vector<StepOutcome> RunStep(FleetHarness& h, const GroupKey& key, const std::vector<int>& placement,
                                 const std::vector<float>& full, std::vector<std::shared_ptr<TrainerStep>>* steps,
                                 int attempt = 0) {
  const int world = static_cast<int>(placement.size());
  std::vector<std::future<StepOutcome>> futures;
  steps->clear();
  for (int r = 0; r < world; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    steps->push_back(MakeStep(key, r, world, full, attempt));
    h.rank(placement[r]).Submit(steps->back(), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  std::vector<StepOutcome> out;
  for (auto& f : futures) {
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << "step " << key.ToString() << " did not finish";
      out.emplace_back();
      out.back().status = absl::DeadlineExceededError("test wait");
      continue;
    }
    out.push_back(f.get());
  }
  return out;
}

// The whole-matrix answer, computed on the backend directly.
inline std::vector<float> Reference(Backend& backend, const std::vector<float>& full) {
  std::vector<float> out(full.size());
  NsOptions options = Highest();
  MatrixJob job{"w", Matrix2d{kRows, kCols}, Matrix2d{kRows, kCols}, DType::kF32, full.data(), DType::kF32,
                out.data(), &options};
  EXPECT_OK(OrthogonalizeOne(backend, job));
  return out;
}

// The result rows of the trainer steps, stitched back together.
inline std::vector<float> Gather(const std::vector<std::shared_ptr<TrainerStep>>& steps) {
  std::vector<float> out;
  for (const auto& s : steps) {
    const float* f = reinterpret_cast<const float*>(s->outputs[0].data());
    out.insert(out.end(), f, f + s->outputs[0].size() / sizeof(float));
  }
  return out;
}

// Submits a retried trainer step and expects it to succeed (by a replay) with `expected` bytes.
inline void ExpectReplayed(Executor& rank, std::shared_ptr<TrainerStep> retry, const std::vector<char>& expected) {
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  rank.Submit(retry, [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  StepOutcome o = future.get();
  ASSERT_OK(o.status);
  ASSERT_OK(o.matrices[0]);
  EXPECT_EQ(retry->outputs[0], expected);
}

}  // namespace orthoserve
