#include "server/fleet/logic/batch_pacer.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "server/distributed/batch.h"

namespace orthoserve {
namespace {

double Sum(const std::vector<double>& costs, size_t begin, size_t end) {
  return std::accumulate(costs.begin() + static_cast<std::ptrdiff_t>(begin),
                         costs.begin() + static_cast<std::ptrdiff_t>(end), 0.0);
}

}  // namespace

std::vector<double> MatrixCosts(const std::vector<MatrixPlan>& matrices) {
  std::vector<double> costs;
  costs.reserve(matrices.size());
  for (const MatrixPlan& m : matrices) costs.push_back(EstimatedCost(m));
  return costs;
}

bool BatchPacer::Queue(const GroupKey& key, const std::vector<MatrixPlan>& specs, bool replay, int members) {
  if (queued_.contains(key)) return false;
  Queued q;
  q.costs = MatrixCosts(specs);
  // A replay is not divided (its kept inputs are taken whole).
  q.part_end = replay ? specs.size() : PartEnd(q.costs, 0, members);
  ready_.Push(key.tenant, key.job, Sum(q.costs, 0, q.part_end), Ready{key, false});
  queued_.emplace(key, std::move(q));
  return true;
}

std::optional<BatchPacer::Turn> BatchPacer::Next(bool pacing) {
  while (!ready_.empty() && (!pacing || static_cast<int>(unran_.size()) < options_.batch_window)) {
    const Ready ready = ready_.Pop();
    if (ready.part) return Turn{ready.key, true, 0, {}};
    auto q = queued_.find(ready.key);
    // Gone (aborted, or appended already), or a rank was withdrawn meanwhile (it is queued again
    // when it is complete again).
    if (q == queued_.end()) continue;
    Turn turn{ready.key, false, q->second.part_end, std::move(q->second.costs)};
    queued_.erase(q);
    return turn;
  }
  return std::nullopt;
}

size_t BatchPacer::PartEnd(const std::vector<double>& costs, size_t begin, int members) const {
  if (options_.part_time <= absl::ZeroDuration() || begin >= costs.size()) return costs.size();
  const double budget = flops_per_second_ * absl::ToDoubleSeconds(options_.part_time);
  // At least one matrix per member: a part of fewer would leave members idle (an AUTO or
  // ROW_SHARDED matrix is computed on one of them).
  const size_t end = std::min(costs.size(), begin + static_cast<size_t>(std::max(members, 1)));
  double cost = Sum(costs, begin, end);
  size_t more = end;
  while (more < costs.size() && cost + costs[more] <= budget) cost += costs[more++];
  return more;
}

void BatchPacer::Divide(LogEntry batch, size_t part_end, std::vector<double> costs) {
  const GroupKey key = batch.key;
  Divided& d = divided_[key];
  d.batch = std::move(batch);
  d.costs = std::move(costs);
  d.next = 0;
  d.end = part_end;
}

std::optional<BatchPacer::Part> BatchPacer::NextPart(const GroupKey& key, bool rest, bool pacing, int64_t generation) {
  auto it = divided_.find(key);
  if (it == divided_.end()) return std::nullopt;
  Divided& d = it->second;
  const std::vector<MatrixPlan>& all = d.batch.plan.matrices;
  // Parts of an earlier generation cannot run any more: the rest goes at once, and fails.
  if (rest || d.batch.generation != generation || !pacing) d.end = all.size();
  Part part;
  LogEntry& entry = part.entry;
  entry.key = key;
  entry.plan.trainer_world = d.batch.plan.trainer_world;
  entry.plan.fleet_world = d.batch.plan.fleet_world;
  entry.plan.matrices.assign(all.begin() + static_cast<std::ptrdiff_t>(d.next),
                             all.begin() + static_cast<std::ptrdiff_t>(d.end));
  entry.submissions = d.batch.submissions;
  entry.digests = d.batch.digests;
  entry.part_offset = static_cast<int64_t>(d.next);
  entry.more_parts = d.end < all.size();
  entry.generation = d.batch.generation;  // Planned for that generation's collective ranks.
  // Balanced within the part, which runs alone.
  AssignOwners(entry.plan, absl::MakeConstSpan(d.costs).subspan(d.next, d.end - d.next));
  part.cost = Sum(d.costs, d.next, d.end);
  if (d.end == all.size()) {
    divided_.erase(it);
    return part;
  }
  d.next = d.end;
  d.end = PartEnd(d.costs, d.next, d.batch.plan.fleet_world);
  // Ahead of the job's later steps: a job's steps still run in order, parts of other jobs and
  // tenants between them.
  ready_.PushFront(key.tenant, key.job, Sum(d.costs, d.next, d.end), Ready{key, true});
  return part;
}

void BatchPacer::Ran(int64_t index, absl::Time now) {
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
}

bool BatchPacer::DropStalled(absl::Time now, absl::Duration timeout) {
  bool stalled = false;
  while (!unran_.empty() && now - unran_.front().at > timeout) {
    unran_.pop_front();
    stalled = true;
  }
  return stalled;
}

}  // namespace orthoserve
