// A fixed-size pool of worker threads that runs queued closures in weighted fair order between
// tenants, and fairly between the jobs of a tenant — the compute queue of a server shared by
// several training jobs (docs/operations.md, "Sharing a server between tenants").
//
// Ordering. Each closure belongs to a flow (tenant, job) and has a cost (any unit; the server
// uses Newton–Schulz FLOPs). Among queued closures of the highest priority class present, a free
// worker takes the next one by self-clocked fair queueing, twice over:
//  - tenants: a tenant's tag is max(V, F_t) + cost / weight_t, where F_t is the tag of the
//    tenant's last dispatched closure and V the tag last dispatched by the pool; the smallest tag
//    runs. Over any busy period each backlogged tenant gets compute in proportion to its weight,
//    within one closure's cost of the ideal (the bound of non-preemptive fair sharing);
//  - jobs within the chosen tenant, the same way with equal weights;
//  - closures of one job in the order they were scheduled.
// Ties go to the earlier scheduled closure. Closures of one flow never run out of order relative
// to each other's dispatch, but several may run at once on different workers.
//
// Thread-safe. The destructor runs every closure already queued, then joins the workers;
// closures scheduled after Shutdown() are run inline by the caller instead of being dropped, so
// a closure that owns a promise always fulfils it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace orthoserve {

class FairPool {
 public:
  // A tenant's share of the pool: compute in proportion to `weight` (> 0) among tenants of the
  // same `priority`; a tenant of a higher priority class is always served first.
  struct Share {
    double weight = 1.0;
    int priority = 0;
  };
  // Shares by tenant name; tenants not listed get the default Share.
  using Shares = std::map<std::string, Share>;

  explicit FairPool(int threads, Shares shares = {});
  ~FairPool();
  FairPool(const FairPool&) = delete;
  FairPool& operator=(const FairPool&) = delete;

  // Queues `closure` for flow (tenant, job) with `cost` (>= 0).
  void Schedule(const std::string& tenant, const std::string& job, double cost, std::function<void()> closure);
  // Queues `closure` in the anonymous flow ("", "") at cost 0.
  void Schedule(std::function<void()> closure) { Schedule("", "", 0, std::move(closure)); }

  // Closures queued and not yet started.
  size_t queued() const;
  void Shutdown();

 private:
  struct Item {
    double cost = 0;
    uint64_t seq = 0;  // Scheduling order: ties and FIFO within a job.
    std::function<void()> closure;
  };
  // A flow's tags: while it has queued closures, its next one starts at `start` and finishes at
  // start + cost / weight; `finish` is the tag of its last dispatched closure.
  struct Job {
    double start = 0;
    double finish = 0;        // In its tenant's job-level virtual time.
    std::deque<Item> items;   // FIFO.
  };
  struct Tenant {
    double start = 0;
    double finish = 0;  // In the pool's virtual time.
    double vtime = 0;   // The tenant's job-level virtual time.
    size_t queued = 0;
    std::map<std::string, Job> jobs;
  };

  void Work();
  // The next closure to run; requires queued_ > 0. Called with mu_ held.
  std::function<void()> PopLocked();
  Share ShareOf(const std::string& tenant) const;

  const Shares shares_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Tenant> tenants_;
  double vtime_ = 0;  // Tag of the closure dispatched last.
  uint64_t seq_ = 0;
  size_t queued_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace orthoserve
