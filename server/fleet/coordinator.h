// The coordinator of a fleet (runs on fleet rank 0): it collects ready reports of trainer
// ranks and appends one totally ordered log of batches that every fleet rank executes in order,
// as Horovod's controller does (DESIGN §3). Pure C++: the fleet service carries its calls
// between processes.
//
// A fleet rank reports a trainer rank ready once it holds all of that trainer's blocks for a
// (group, step). When all W trainer ranks of the step have reported, the coordinator checks that
// they agree (same world, no duplicate rank, the same spec list — INVALID_ARGUMENT naming the
// first difference otherwise), builds the BatchPlan (placements, AUTO owners) and appends it.
// A step whose ranks do not all arrive within the rendezvous timeout is appended as ABORTED,
// naming the missing trainer ranks; an explicit Abort (a trainer's stream failed) is appended as
// ABORTED naming the rank and its reason. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/shape.h"
#include "server/distributed/batch.h"
#include "server/fleet/group_step.h"

namespace orthoserve {

// One trainer rank's readiness for a step: its specs and its blocks (one per matrix).
struct ReadyReport {
  GroupKey key;
  int trainer_rank = 0;
  int trainer_world = 1;
  int fleet_rank = 0;
  std::vector<MatrixPlan> matrices;  // Placements empty.
  std::vector<Block> blocks;         // One per matrix.
};

// One entry of the ordered log. `status` OK: execute `plan` for `key`. Otherwise the step is
// failed on every rank with `status`.
struct LogEntry {
  int64_t index = 0;
  GroupKey key;
  absl::Status status;
  BatchPlan plan;
};

class Coordinator {
 public:
  struct Options {
    int fleet_world = 1;                                    // S.
    absl::Duration rendezvous_timeout = absl::Seconds(60);  // From a step's first report.
    absl::Duration stall_warning = absl::Seconds(60);       // Log the missing ranks once after this.
    std::function<void()> on_rendezvous_timeout;            // Metrics hook; may be empty.
  };

  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const Options& options);
  ~Coordinator();

  void Report(ReadyReport report);
  void Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason);

  // Entries with index >= `from`, waiting up to `timeout` for at least one. `reader` (a fleet
  // rank) lets the coordinator drop entries every rank has read. Empty after Shutdown.
  std::vector<LogEntry> Read(int reader, int64_t from, absl::Duration timeout);

  // Steps waiting for ranks (for tests and metrics).
  size_t pending_steps() const;

  // Fleet ranks that have read the log before but not within `silence` (a peer that died).
  std::vector<int> SilentReaders(absl::Duration silence) const;

  // Wakes readers and stops the timer thread; later calls are no-ops.
  void Shutdown();

 private:
  struct Pending {
    absl::Time first_report;
    int trainer_world = 1;
    std::vector<std::optional<ReadyReport>> reports;
    int arrived = 0;
    bool warned = false;
  };

  explicit Coordinator(const Options& options);
  void AppendLocked(const GroupKey& key, absl::Status status, BatchPlan plan);
  absl::StatusOr<BatchPlan> BuildPlanLocked(Pending& pending);
  void TimerLoop();

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable log_cv_;
  std::condition_variable timer_cv_;
  absl::flat_hash_map<GroupKey, Pending> pending_;
  std::deque<LogEntry> log_;  // log_.front().index == first_index_.
  int64_t first_index_ = 0;
  std::vector<int64_t> cursors_;  // Next index each fleet rank will read.
  std::vector<absl::Time> last_read_;  // When each fleet rank last read; InfinitePast: never.
  bool shutdown_ = false;
  std::thread timer_;
};

}  // namespace orthoserve
