// Implementation of server/rpc/admission.h.
#include "server/rpc/admission.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/message_text.h"

namespace orthoserve {
namespace {

std::vector<std::string> SortedUnique(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// floor(x), forgiving the rounding of a quotient that is a whole number (8 * 1/3 * 3).
int FloorSlots(double x) { return static_cast<int>(std::floor(x + 1e-9)); }

}  // namespace

Admission::Admission(const Options& options, Metrics* metrics)
    : options_(options), metrics_(metrics), known_tenants_(SortedUnique(options.tenants)) {}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = other.owner_;
    tenant_ = std::move(other.tenant_);
    bytes_ = other.bytes_;
    stream_ = other.stream_;
    other.owner_ = nullptr;
    other.bytes_ = 0;
    other.stream_ = false;
  }
  return *this;
}

void Admission::Ticket::Release() {
  if (owner_ != nullptr && (bytes_ > 0 || stream_)) owner_->Return(tenant_, bytes_, stream_);
  bytes_ = 0;
  stream_ = false;
}

absl::Status Admission::AdmitCall(const std::string& tenant) {
  const double limit = options_.max_tenant_calls_per_second;
  if (!(limit > 0)) return absl::OkStatus();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  std::deque<absl::Time>& calls = tenant_calls_[tenant];
  while (!calls.empty() && now - calls.front() >= absl::Seconds(1)) calls.pop_front();
  if (static_cast<double>(calls.size()) + 1 > limit) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "tenant_call_rate");
    const absl::Duration wait = calls.empty() ? absl::Seconds(1) : calls.front() + absl::Seconds(1) - now;
    return absl::ResourceExhaustedError(absl::StrCat("tenant \"", BoundedText(tenant), "\" started ", calls.size(),
                                                     " calls in the last second, its limit of ", limit,
                                                     " per second (--max-tenant-calls-per-second); retry in ",
                                                     absl::FormatDuration(absl::Ceil(wait, absl::Milliseconds(1)))));
  }
  calls.push_back(now);
  // Tenants that went quiet are forgotten, once a second rather than on every call.
  if (now - calls_swept_ >= absl::Seconds(1)) {
    calls_swept_ = now;
    for (auto it = tenant_calls_.begin(); it != tenant_calls_.end();) {
      auto next = std::next(it);
      if (it->second.empty() || now - it->second.back() >= absl::Seconds(1)) tenant_calls_.erase(it);
      it = next;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Admission::Ticket> Admission::AcquireStream(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  const int limit = options_.max_concurrent_streams;
  if (streams_ >= limit) {
    stream_refused_[tenant] = now;
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "concurrent_streams");
    return absl::ResourceExhaustedError(absl::StrCat("the server is serving ", streams_, " streams, its limit of ",
                                                     limit,
                                                     " concurrent streams (--max-concurrent-streams); retry later"));
  }
  const auto held = tenant_streams_.find(tenant);
  const int mine = held == tenant_streams_.end() ? 0 : held->second;
  if (options_.max_tenant_concurrent_streams > 0 && mine >= options_.max_tenant_concurrent_streams) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "tenant_concurrent_streams");
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", BoundedText(tenant), "\" has ", mine, " streams open, its limit of ",
        options_.max_tenant_concurrent_streams, " (--max-tenant-concurrent-streams); close one or retry later"));
  }
  // Under its share a tenant leaves only the kept slots free; at or over it, every other reserve.
  const StreamReserve reserve = StreamReserveLocked(tenant, now);
  const bool under_share = mine < reserve.share;
  if (streams_ + 1 + (under_share ? reserve.idle_tenants : reserve.for_others) > limit) {
    stream_refused_[tenant] = now;
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "fair_share");
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", BoundedText(tenant), "\" has ", mine, " streams open and its fair share is ", reserve.share,
        " of the server's ", limit, " (--max-concurrent-streams, weighted by --tenant-shares); the ", limit - streams_,
        " free are kept for ", under_share ? 0 : reserve.waiting_tenants, " other tenants waiting for their share and ",
        reserve.idle_tenants, " tenants of the token file with no streams; retry later"));
  }
  ++streams_;
  ++tenant_streams_[tenant];
  if (metrics_ != nullptr) metrics_->inflight_streams().Set(streams_);
  Ticket ticket;
  ticket.owner_ = this;
  ticket.tenant_ = tenant;
  ticket.stream_ = true;
  return ticket;
}

double Admission::Weight(const std::string& tenant) const {
  const auto it = options_.tenant_shares.find(tenant);
  return it == options_.tenant_shares.end() || !(it->second.weight > 0) ? 1.0 : it->second.weight;
}

Admission::StreamReserve Admission::StreamReserveLocked(const std::string& tenant, absl::Time now) {
  for (auto it = stream_refused_.begin(); it != stream_refused_.end();) {
    auto next = std::next(it);
    if (now - it->second >= kFairShareMemory) stream_refused_.erase(it);
    it = next;
  }
  // Tenants with traffic: the caller, holders of slots, and tenants refused lately.
  absl::flat_hash_set<std::string> traffic = {tenant};
  for (const auto& [name, count] : tenant_streams_) traffic.insert(name);
  for (const auto& [name, when] : stream_refused_) traffic.insert(name);
  double traffic_weight = 0;
  for (const std::string& name : traffic) traffic_weight += Weight(name);
  double all_weight = traffic_weight;
  for (const std::string& name : known_tenants_) {
    if (!traffic.contains(name)) all_weight += Weight(name);
  }
  const int limit = options_.max_concurrent_streams;
  StreamReserve r;
  // One slot kept for each token file tenant without traffic whose part of the limit is a slot.
  for (const std::string& name : known_tenants_) {
    if (!traffic.contains(name) && FloorSlots(limit * Weight(name) / all_weight) >= 1) ++r.idle_tenants;
  }
  const int divided = limit - r.idle_tenants;
  const auto share_of = [&](const std::string& name) {
    int share = FloorSlots(divided * Weight(name) / traffic_weight);
    if (options_.max_tenant_concurrent_streams > 0) share = std::min(share, options_.max_tenant_concurrent_streams);
    return share;
  };
  r.share = share_of(tenant);
  r.for_others = r.idle_tenants;
  for (const auto& [name, when] : stream_refused_) {
    if (name == tenant) continue;
    const auto held = tenant_streams_.find(name);
    const int need = share_of(name) - (held == tenant_streams_.end() ? 0 : held->second);
    if (need > 0) {
      r.for_others += need;
      ++r.waiting_tenants;
    }
  }
  return r;
}

absl::Status Admission::AddBytes(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what) {
  absl::MutexLock lock(&mu_);
  Short shortage;
  return TryAddLocked(ticket, tenant, bytes, what, /*refuse=*/true, &shortage);
}

absl::Status Admission::TryAddLocked(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what,
                                     bool refuse, Short* shortage) {
  *shortage = Short::kNone;
  if (ticket.owner_ != nullptr && ticket.tenant_ != tenant) {
    return absl::InternalError(absl::StrCat("admission ticket of tenant \"", BoundedText(ticket.tenant_),
                                            "\" used for tenant \"", BoundedText(tenant), "\""));
  }
  int64_t& tenant_total = tenant_bytes_[tenant];
  if (bytes > options_.max_inflight_bytes - bytes_) {
    *shortage = Short::kServer;
    if (!refuse) return absl::ResourceExhaustedError("");
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "inflight_bytes");
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes but the server holds ", bytes_,
                                                     " of its ", options_.max_inflight_bytes,
                                                     " in flight (--max-inflight-bytes); retry later or send less"));
  }
  if (bytes > options_.max_tenant_inflight_bytes - tenant_total) {
    *shortage = Short::kTenant;
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "tenant_inflight_bytes");
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", bytes, " bytes but tenant \"", BoundedText(tenant), "\" holds ", tenant_total,
                     " of its ", options_.max_tenant_inflight_bytes, " in flight (--max-tenant-inflight-bytes)"));
  }
  bytes_ += bytes;
  tenant_total += bytes;
  ticket.owner_ = this;
  ticket.tenant_ = tenant;
  ticket.bytes_ += bytes;
  if (metrics_ != nullptr) {
    metrics_->inflight_bytes().Set(static_cast<double>(bytes_));
    metrics_->TenantInflightBytes(tenant, tenant_total, LargestTenantBytesLocked());
  }
  return absl::OkStatus();
}

uint64_t Admission::AddBytesWhenAvailable(Ticket* ticket, const std::string& tenant, int64_t bytes, std::string what,
                                          std::function<void(absl::Status)> done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (bytes > options_.max_inflight_bytes) {
      if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "inflight_bytes");
      status = absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes, more than the server's ",
                                                         options_.max_inflight_bytes,
                                                         " in flight (--max-inflight-bytes)"));
    } else {
      Short shortage = Short::kServer;
      // Behind earlier waiters in any case (arrival order, so that a large request is not
      // overtaken for ever by smaller ones), unless the tenant's own limit refuses it now.
      const auto mine = tenant_bytes_.find(tenant);
      const int64_t tenant_total = mine == tenant_bytes_.end() ? 0 : mine->second;
      if (waiters_.empty() || bytes > options_.max_tenant_inflight_bytes - tenant_total) {
        status = TryAddLocked(*ticket, tenant, bytes, what, /*refuse=*/false, &shortage);
      }
      if (shortage == Short::kServer) {
        const uint64_t id = next_wait_id_++;
        waiters_.push_back(Waiter{id, ticket, tenant, bytes, std::move(what), std::move(done)});
        return id;
      }
    }
  }
  done(std::move(status));
  return 0;
}

absl::Status Admission::Resize(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what) {
  const int64_t held = ticket.bytes_;
  if (bytes > held) return AddBytes(ticket, tenant, bytes - held, what);
  if (bytes < held) {
    ticket.bytes_ = bytes;
    Return(tenant, held - bytes, /*stream=*/false);
  }
  return absl::OkStatus();
}

bool Admission::CancelWait(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
    if (it->id == id) {
      waiters_.erase(it);
      return true;
    }
  }
  return false;
}

size_t Admission::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

void Admission::DrainWaitersLocked(std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>& ready) {
  while (!waiters_.empty()) {
    Waiter& w = waiters_.front();
    Short shortage;
    absl::Status status = TryAddLocked(*w.ticket, w.tenant, w.bytes, w.what, /*refuse=*/false, &shortage);
    if (shortage == Short::kServer) return;  // Still no room: the head waits on.
    ready.emplace_back(std::move(w.done), std::move(status));
    waiters_.pop_front();
  }
}

void Admission::Return(const std::string& tenant, int64_t bytes, bool stream) {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> ready;
  absl::ReleasableMutexLock lock(&mu_);
  if (stream) {
    --streams_;
    auto it = tenant_streams_.find(tenant);
    if (it != tenant_streams_.end() && --it->second <= 0) tenant_streams_.erase(it);
    if (metrics_ != nullptr) metrics_->inflight_streams().Set(streams_);
  }
  if (bytes > 0) {
    bytes_ -= bytes;
    auto it = tenant_bytes_.find(tenant);
    const int64_t left = it == tenant_bytes_.end() ? 0 : (it->second -= bytes);
    if (it != tenant_bytes_.end() && left <= 0) tenant_bytes_.erase(it);
    if (metrics_ != nullptr) {
      metrics_->inflight_bytes().Set(static_cast<double>(bytes_));
      metrics_->TenantInflightBytes(tenant, std::max<int64_t>(left, 0), LargestTenantBytesLocked());
    }
    DrainWaitersLocked(ready);
  }
  lock.Release();
  for (auto& [done, status] : ready) done(std::move(status));
}

int64_t Admission::LargestTenantBytesLocked() const {
  int64_t largest = 0;
  for (const auto& [tenant, bytes] : tenant_bytes_) largest = std::max(largest, bytes);
  return largest;
}

int64_t Admission::inflight_bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace orthoserve
