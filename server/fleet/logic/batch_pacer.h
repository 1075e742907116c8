// The order in which complete steps go into the log: the pacing and parts part of the
// coordinator (coordinator.h, "Order of batches" and "Parts"). Complete steps wait in a fair
// queue while `batch_window` appended batches have not run on rank 0; a large step is cut into
// parts of about `part_time` of work, each queued again ahead of its job's later steps. It
// remembers what it needs across calls (the queue, the divided steps, the appended batches not
// yet run and the measured FLOPs rate); the coordinator appends what it hands out. Not
// thread-safe: the coordinator's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/fair_queue.h"
#include "server/fleet/logic/fleet_log.h"

namespace orthoserve {

// Each matrix's estimated cost (EstimatedCost), in order: computed once per step and reused for
// every part, so that no matrix is estimated (and checked) again per part.
std::vector<double> MatrixCosts(const std::vector<MatrixPlan>& matrices);

class BatchPacer {
 public:
  struct Options {
    int batch_window = 0;                             // 0: no pacing.
    absl::Duration part_time = absl::ZeroDuration();  // 0: steps go whole.
    FairShares shares;                                // Tenants' weights and priority classes.
  };
  explicit BatchPacer(const Options& options) : options_(options), ready_(options.shares) {}

  // Pacing is on, and possible in `generation`: only rank 0's executor says when a batch ran,
  // and only while it runs them all (`rank_zero_runs_every_batch`).
  bool Pacing(bool rank_zero_runs_every_batch) const {
    return options_.batch_window > 0 && rank_zero_runs_every_batch;
  }

  // Queues complete step `key` of `specs` for its turn, charged its first part's cost (a replay
  // goes whole); `members` of the generation bound a part from below. False when it is queued
  // already (a retry replaced one of its reports).
  bool Queue(const GroupKey& key, const std::vector<MatrixPlan>& specs, bool replay, int members);
  // Step `key` lost a report: it is not complete any more (queued again when it is).
  void Unqueue(const GroupKey& key) { queued_.erase(key); }

  // What may go into the log next.
  struct Turn {
    GroupKey key;
    bool part = false;           // The next part of a divided step; otherwise a queued step:
    size_t part_end = 0;         // the end of its first part (its size: whole),
    std::vector<double> costs;   // and its matrices' costs.
  };
  // The next turn in fair order while the window has room (any while not `pacing`); nullopt
  // when none. A queued step taken out by Unqueue is skipped.
  std::optional<Turn> Next(bool pacing);

  // Step `key` is to go in parts: its whole batch (planned for its generation), the end of its
  // first part and every matrix's cost.
  void Divide(LogEntry batch, size_t part_end, std::vector<double> costs);
  bool divided(const GroupKey& key) const { return divided_.contains(key); }
  // A part to append, with its estimated cost.
  struct Part {
    LogEntry entry;
    double cost = 0;
  };
  // The next part of divided step `key` (all that remains when `rest`, when not `pacing`, or when
  // `generation` is not the one it was planned in: such parts cannot run and go at once, to
  // fail), its AUTO owners balanced within the part; the rest is queued ahead of its job's later
  // steps. nullopt when `key` is not divided.
  std::optional<Part> NextPart(const GroupKey& key, bool rest, bool pacing, int64_t generation);
  // The parts still to come of `key` are dropped (its step failed).
  void Forget(const GroupKey& key) { divided_.erase(key); }

  // Batch `index` of estimated `cost` went into the log at `at`.
  void Appended(int64_t index, double cost, absl::Time at) { unran_.push_back(Unran{index, at, cost}); }
  // Rank 0 ran every batch up to `index` (by `now`): the window moves, and the FLOPs rate that
  // sizes parts is measured.
  void Ran(int64_t index, absl::Time now);
  // Drops batches rank 0 has not reported as run within `timeout` (its executor is stuck or
  // gone: they no longer hold the queue back); true when it dropped one.
  bool DropStalled(absl::Time now, absl::Duration timeout);
  // A new generation: nothing is paced until it forms, and the old one's batches hold nothing back.
  void Reformed() { unran_.clear(); }

  size_t queued() const { return ready_.size(); }

 private:
  // A step in the fair order of batches: complete and not yet appended, or (`part`) the rest of
  // a divided one.
  struct Ready {
    GroupKey key;
    bool part = false;
  };
  // A queued step: the end of the first part it was charged for, and its matrices' costs.
  struct Queued {
    size_t part_end = 0;
    std::vector<double> costs;
  };
  // A divided step: its whole batch, its matrices' costs, and the part to append next: [next, end).
  struct Divided {
    LogEntry batch;
    std::vector<double> costs;
    size_t next = 0;
    size_t end = 0;
  };
  // Appended batches not yet run on rank 0: their index, when appended, their estimated cost.
  struct Unran {
    int64_t index = 0;
    absl::Time at;
    double cost = 0;
  };
  // The end of the part that starts at `begin` of matrices of `costs` (see "Parts"); costs.size()
  // when not dividing.
  size_t PartEnd(const std::vector<double>& costs, size_t begin, int members) const;

  const Options options_;
  FairQueue<Ready> ready_;  // Complete steps and parts for their turn; stale keys are skipped.
  absl::flat_hash_map<GroupKey, Queued> queued_;
  absl::flat_hash_map<GroupKey, Divided> divided_;
  std::deque<Unran> unran_;
  absl::Time last_ran_ = absl::InfinitePast();  // When rank 0 last reported a batch run.
  double flops_per_second_ = 0;                 // Rank 0's batches, measured (0: none yet); sizes parts.
};

}  // namespace orthoserve
