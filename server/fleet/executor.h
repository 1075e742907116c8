// Executor: runs the coordinator's log on one fleet rank. Trainer steps received by this rank
// wait here until their batch (or its abort) comes up in the log; batches run one at a time,
// in log order, so every rank makes the same collective calls in the same order.
//
// Thread-safe. Callbacks run on the executor thread (or on the caller's thread when Submit
// fails at once); they must not block on the executor.
#pragma once

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/collective/collective.h"
#include "server/distributed/batch.h"
#include "server/engine/backend.h"
#include "server/fleet/group_step.h"
#include "server/fleet/log_source.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

class Executor {
 public:
  struct Options {
    int fleet_rank = 0;
    Backend* backend = nullptr;        // Not owned.
    Collective* collective = nullptr;  // Not owned; used only from the executor thread.
    LogSource* log = nullptr;          // Not owned.
    Metrics* metrics = nullptr;        // Optional, not owned.
    ExecuteOptions execute;
  };

  static absl::StatusOr<std::unique_ptr<Executor>> Create(const Options& options);
  ~Executor();  // Fails steps still waiting with UNAVAILABLE.

  // Registers this trainer rank's part of a step and reports it ready; `done` runs exactly once.
  void Submit(std::shared_ptr<TrainerStep> step, StepCallback done);

  // A trainer's stream failed before or after Submit: abort the step on every rank.
  void AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason);

  // Steps submitted here and not yet executed.
  size_t waiting() const;

  // OK while this rank can run batches. UNAVAILABLE once a batch's collective failed (the
  // group is broken for good), or when the coordinator's log has been unreachable for longer
  // than `silence`.
  absl::Status Health(absl::Duration silence) const;

  void Shutdown();

 private:
  struct Waiting {
    std::shared_ptr<TrainerStep> step;
    StepCallback done;
  };

  explicit Executor(const Options& options);
  void Loop();
  void Apply(const LogEntry& entry);

  const Options options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<GroupKey, std::vector<Waiting>> waiting_;
  bool stopping_ = false;
  absl::Status broken_;                   // First collective failure.
  absl::Time last_contact_ = absl::Now(); // Last successful read of the log.
  std::thread thread_;
};

}  // namespace orthoserve
