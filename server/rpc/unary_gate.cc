// Implementation of server/rpc/unary_gate.h.
#include "server/rpc/unary_gate.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/retry_after.h"

namespace orthoserve {

UnaryGate::Slot& UnaryGate::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = other.gate_;
    tenant_ = std::move(other.tenant_);
    other.gate_ = nullptr;
  }
  return *this;
}

void UnaryGate::Slot::Release() {
  if (gate_ != nullptr) gate_->Release(tenant_);
  gate_ = nullptr;
}

UnaryGate::UnaryGate(const Options& options, Metrics* metrics)
    : options_(options),
      metrics_(metrics),
      slots_(options.max_concurrent, options.max_tenant_concurrent, options.tenant_shares, options.tenants,
             {"unary calls", "--max-concurrent-unary", "--max-tenant-concurrent-unary"}) {}

uint64_t UnaryGate::Acquire(Slot* slot, const std::string& tenant, std::function<void(absl::Status)> done) {
  Ready ready;
  absl::Status status;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    // Slots that a lapsed reserve left free go to those already waiting first.
    GrantLocked(ready);
    FairSlots::Refusal refused_by = FairSlots::Refusal::kLimit;
    // Behind the tenant's own waiters in any case (arrival order within a tenant).
    if (!(queues_.count(tenant) > 0)) status = slots_.Acquire(tenant, Now(), &refused_by);
    if (status.ok() && !(queues_.count(tenant) > 0)) {
      slot->gate_ = this;
      slot->tenant_ = tenant;
    } else {
      id = next_id_++;
      status = EnqueueLocked(tenant, Waiter{id, slot, done}, ready);
      if (!status.ok()) id = 0;
    }
    if (id == 0) ready.emplace_back(std::move(done), status);
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
  return id;
}

absl::Status UnaryGate::EnqueueLocked(const std::string& tenant, Waiter waiter, Ready& ready) {
  const size_t limit = static_cast<size_t>(std::max(options_.max_waiters, 0));
  if (waiting_ >= limit) {
    double weight_sum = slots_.Weight(tenant);
    for (const auto& [name, queue] : queues_) {
      if (name != tenant) weight_sum += slots_.Weight(name);
    }
    const auto mine_it = queues_.find(tenant);
    const int mine = mine_it == queues_.end() ? 0 : static_cast<int>(mine_it->second.size());
    const int part = QueuePartLocked(tenant, weight_sum);
    // The tenant most over its part, when this one is under its own.
    std::string victim;
    int victim_over = 0;
    if (mine < part) {
      for (const auto& [name, queue] : queues_) {
        const int over = static_cast<int>(queue.size()) - QueuePartLocked(name, weight_sum);
        if (name != tenant && over > victim_over) {
          victim = name;
          victim_over = over;
        }
      }
    }
    if (victim_over == 0) {
      if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "unary_waiters");
      return MarkRetryAfter(
          absl::ResourceExhaustedError(absl::StrCat(
              "the server is serving ", slots_.held(), " unary calls and ", waiting_,
              " more wait for a slot, its limit of ", limit, " waiting (--max-unary-waiters); tenant \"",
              BoundedText(tenant), "\" has ", mine, " waiting and its part of the queue is ", part,
              " (weighted by --tenant-shares); retry later")),
          kBusyRetryAfter);
    }
    std::deque<Waiter>& queue = queues_[victim];
    Waiter pushed = std::move(queue.back());
    queue.pop_back();
    if (queue.empty()) queues_.erase(victim);
    --waiting_;
    if (metrics_ != nullptr) metrics_->TenantCut(victim, "pushed_out");
    ready.emplace_back(
        std::move(pushed.done),
        MarkRetryAfter(absl::ResourceExhaustedError(absl::StrCat(
                           "the unary call waited for a slot and was pushed out of the full queue (", limit,
                           " waiting, --max-unary-waiters) by a tenant under its part of it: tenant \"",
                           BoundedText(victim), "\" had ", victim_over,
                           " more waiting than its part (weighted by --tenant-shares); retry later")),
                       kBusyRetryAfter));
  }
  queues_[tenant].push_back(std::move(waiter));
  ++waiting_;
  return absl::OkStatus();
}

int UnaryGate::QueuePartLocked(const std::string& tenant, double weight_sum) const {
  return static_cast<int>(std::floor(options_.max_waiters * slots_.Weight(tenant) / weight_sum + 1e-9));
}

void UnaryGate::TouchWaitingLocked(absl::Time now) {
  for (const auto& [name, queue] : queues_) {
    if (options_.max_tenant_concurrent <= 0 || slots_.held(name) < options_.max_tenant_concurrent) {
      slots_.Touch(name, now);
    }
  }
}

void UnaryGate::GrantLocked(Ready& ready) {
  const absl::Time now = Now();
  while (!queues_.empty() && slots_.held() < slots_.limit()) {
    TouchWaitingLocked(now);
    // The waiting tenants, fewest slots per weight first (then the one waiting longest).
    std::vector<std::tuple<double, uint64_t, std::string>> order;
    for (const auto& [name, queue] : queues_) {
      order.emplace_back(slots_.held(name) / slots_.Weight(name), queue.front().id, name);
    }
    std::sort(order.begin(), order.end());
    bool granted = false;
    for (const auto& [ratio, first, name] : order) {
      FairSlots::Refusal refused_by;
      if (!slots_.Acquire(name, now, &refused_by).ok()) continue;
      std::deque<Waiter>& queue = queues_[name];
      Waiter w = std::move(queue.front());
      queue.pop_front();
      if (queue.empty()) queues_.erase(name);
      --waiting_;
      w.slot->gate_ = this;
      w.slot->tenant_ = name;
      ready.emplace_back(std::move(w.done), absl::OkStatus());
      granted = true;
      break;
    }
    if (!granted) return;
  }
}

void UnaryGate::Release(const std::string& tenant) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    slots_.Release(tenant);
    GrantLocked(ready);
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

bool UnaryGate::CancelWait(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (auto it = queues_.begin(); it != queues_.end(); ++it) {
    std::deque<Waiter>& queue = it->second;
    for (auto w = queue.begin(); w != queue.end(); ++w) {
      if (w->id != id) continue;
      queue.erase(w);
      if (queue.empty()) queues_.erase(it);
      --waiting_;
      return true;
    }
  }
  return false;
}

int UnaryGate::held() const {
  absl::MutexLock lock(&mu_);
  return slots_.held();
}

size_t UnaryGate::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

}  // namespace orthoserve
