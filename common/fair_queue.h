// A queue that hands out its items in weighted fair order between tenants, and fairly between
// the jobs of a tenant: the order of the compute pool (common/fair_pool.h) and of the fleet's
// group batches (server/fleet/logic/coordinator.h).
//
// Each item belongs to a flow (tenant, job) and has a cost (any unit; orthoserve uses
// Newton–Schulz FLOPs). Among queued items of the highest priority class present, Pop takes the
// next one by self-clocked fair queueing, twice over:
//  - tenants: a tenant's tag is max(V, F_t) + cost / weight_t, where F_t is the tag of the
//    tenant's last popped item and V the tag last popped; the smallest tag goes first. Over any
//    busy period each backlogged tenant gets service in proportion to its weight, within one
//    item's cost of the ideal (the bound of non-preemptive fair sharing);
//  - jobs within the chosen tenant, the same way with equal weights;
//  - items of one job in the order they were pushed.
// Ties go to the earlier pushed item. A tenant that was idle earns no credit for it. Not
// thread-safe: the owner locks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>

namespace orthoserve {

// A tenant's share: service in proportion to `weight` (> 0) among tenants of the same
// `priority`; a tenant of a higher priority class is always served first.
struct FairShare {
  double weight = 1.0;
  int priority = 0;
};
// Shares by tenant name; tenants not listed get the default FairShare.
using FairShares = std::map<std::string, FairShare>;

template <typename T>
class FairQueue {
 public:
  explicit FairQueue(FairShares shares = {}) : shares_(std::move(shares)) {}

  // Queues `item` for flow (tenant, job) with `cost` (< 0 counts as 0).
  void Push(const std::string& tenant, const std::string& job, double cost, T item) {
    Enqueue(tenant, job, cost, std::move(item), /*front=*/false);
  }
  // Queues `item` ahead of its job's other items: the rest of an item just popped, which keeps its
  // place in the job's order (its tags go on from the popped part's, as for any backlogged flow).
  void PushFront(const std::string& tenant, const std::string& job, double cost, T item) {
    Enqueue(tenant, job, cost, std::move(item), /*front=*/true);
  }

  // The next item in fair order. Requires !empty().
  T Pop() {
    int priority = std::numeric_limits<int>::min();
    for (const auto& [name, t] : tenants_) {
      if (t.queued > 0) priority = std::max(priority, ShareOf(name).priority);
    }
    // The smallest (tag, seq) among tenants of that class, each offering its own smallest job.
    Tenant* tenant = nullptr;
    Job* job = nullptr;
    double tenant_tag = 0, job_tag = 0;
    uint64_t best_seq = 0;
    for (auto& [name, t] : tenants_) {
      if (t.queued == 0) continue;
      const FairShare share = ShareOf(name);
      if (share.priority != priority) continue;
      Job* j_best = nullptr;
      double j_tag = 0;
      for (auto& [job_name, j] : t.jobs) {
        if (j.items.empty()) continue;
        const double tag = j.start + j.items.front().cost;
        if (j_best == nullptr || tag < j_tag || (tag == j_tag && j.items.front().seq < j_best->items.front().seq)) {
          j_best = &j;
          j_tag = tag;
        }
      }
      const Item& head = j_best->items.front();
      const double tag = t.start + head.cost / share.weight;
      if (tenant == nullptr || tag < tenant_tag || (tag == tenant_tag && head.seq < best_seq)) {
        tenant = &t;
        job = j_best;
        tenant_tag = tag;
        job_tag = j_tag;
        best_seq = head.seq;
      }
    }
    T item = std::move(job->items.front().item);
    job->items.pop_front();
    job->finish = job_tag;
    tenant->vtime = std::max(tenant->vtime, job_tag);
    if (!job->items.empty()) job->start = job->finish;
    tenant->finish = tenant_tag;
    vtime_ = std::max(vtime_, tenant_tag);
    --tenant->queued;
    --size_;
    if (tenant->queued > 0) tenant->start = tenant->finish;
    // Forget idle flows whose tags the virtual clock has passed: they would start at the clock
    // anyway, so only flows that are owed nothing are dropped, and the maps stay small.
    for (auto it = tenant->jobs.begin(); it != tenant->jobs.end();) {
      it = it->second.items.empty() && it->second.finish <= tenant->vtime ? tenant->jobs.erase(it) : std::next(it);
    }
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      it = it->second.queued == 0 && it->second.finish <= vtime_ ? tenants_.erase(it) : std::next(it);
    }
    return item;
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

 private:
  void Enqueue(const std::string& tenant, const std::string& job, double cost, T item, bool front) {
    Tenant& t = tenants_[tenant];
    if (t.queued == 0) t.start = std::max(vtime_, t.finish);
    Job& j = t.jobs[job];
    if (j.items.empty()) j.start = std::max(t.vtime, j.finish);
    Item queued{std::max(0.0, cost), seq_++, std::move(item)};
    if (front) {
      j.items.push_front(std::move(queued));
    } else {
      j.items.push_back(std::move(queued));
    }
    ++t.queued;
    ++size_;
  }

  struct Item {
    double cost = 0;
    uint64_t seq = 0;  // Push order: ties and FIFO within a job.
    T item;
  };
  // A flow's tags: while it has queued items, its next one starts at `start` and finishes at
  // start + cost / weight; `finish` is the tag of its last popped item.
  struct Job {
    double start = 0;
    double finish = 0;  // In its tenant's job-level virtual time.
    std::deque<Item> items;
  };
  struct Tenant {
    double start = 0;
    double finish = 0;  // In the queue's virtual time.
    double vtime = 0;   // The tenant's job-level virtual time.
    size_t queued = 0;
    std::map<std::string, Job> jobs;
  };

  FairShare ShareOf(const std::string& tenant) const {
    auto it = shares_.find(tenant);
    FairShare share = it == shares_.end() ? FairShare{} : it->second;
    if (!(share.weight > 0)) share.weight = 1.0;
    return share;
  }

  const FairShares shares_;
  std::map<std::string, Tenant> tenants_;
  double vtime_ = 0;  // Tag of the item popped last.
  uint64_t seq_ = 0;
  size_t size_ = 0;
};

}  // namespace orthoserve
