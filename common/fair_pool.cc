// Implementation of common/fair_pool.h.
#include "common/fair_pool.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace orthoserve {

FairPool::FairPool(int threads, Shares shares) : shares_(std::move(shares)) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { Work(); });
}

FairPool::~FairPool() {
  Shutdown();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void FairPool::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

FairPool::Share FairPool::ShareOf(const std::string& tenant) const {
  auto it = shares_.find(tenant);
  Share share = it == shares_.end() ? Share{} : it->second;
  if (!(share.weight > 0)) share.weight = 1.0;
  return share;
}

void FairPool::Schedule(const std::string& tenant, const std::string& job, double cost,
                        std::function<void()> closure) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      Tenant& t = tenants_[tenant];
      if (t.queued == 0) t.start = std::max(vtime_, t.finish);
      Job& j = t.jobs[job];
      if (j.items.empty()) j.start = std::max(t.vtime, j.finish);
      j.items.push_back(Item{std::max(0.0, cost), seq_++, std::move(closure)});
      ++t.queued;
      ++queued_;
      cv_.notify_one();
      return;
    }
  }
  closure();
}

size_t FairPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

std::function<void()> FairPool::PopLocked() {
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
    const Share share = ShareOf(name);
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
  std::function<void()> closure = std::move(job->items.front().closure);
  job->items.pop_front();
  job->finish = job_tag;
  tenant->vtime = std::max(tenant->vtime, job_tag);
  if (!job->items.empty()) job->start = job->finish;
  tenant->finish = tenant_tag;
  vtime_ = std::max(vtime_, tenant_tag);
  --tenant->queued;
  --queued_;
  if (tenant->queued > 0) tenant->start = tenant->finish;
  // Forget idle flows whose tags the virtual clock has passed: they would start at the clock
  // anyway, so only flows that are owed nothing are dropped, and the maps stay small.
  for (auto it = tenant->jobs.begin(); it != tenant->jobs.end();) {
    it = it->second.items.empty() && it->second.finish <= tenant->vtime ? tenant->jobs.erase(it) : std::next(it);
  }
  for (auto it = tenants_.begin(); it != tenants_.end();) {
    it = it->second.queued == 0 && it->second.finish <= vtime_ ? tenants_.erase(it) : std::next(it);
  }
  return closure;
}

void FairPool::Work() {
  for (;;) {
    std::function<void()> closure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || queued_ > 0; });
      if (queued_ == 0) return;  // Stopping and drained.
      closure = PopLocked();
    }
    closure();
  }
}

}  // namespace orthoserve
