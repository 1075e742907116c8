// Implementation of server/rpc/admission.h.
#include "server/rpc/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/retry_after.h"

namespace orthoserve {
Admission::Admission(const Options& options, Metrics* metrics)
    : options_(options),
      metrics_(metrics),
      streams_(options.max_concurrent_streams, options.max_tenant_concurrent_streams, options.tenant_shares,
               options.tenants, {"streams", "--max-concurrent-streams", "--max-tenant-concurrent-streams"}) {}

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
    return MarkRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat("tenant \"", BoundedText(tenant), "\" started ", calls.size(),
                                                  " calls in the last second, its limit of ", limit,
                                                  " per second (--max-tenant-calls-per-second); retry in ",
                                                  absl::FormatDuration(absl::Ceil(wait, absl::Milliseconds(1))))),
        absl::Ceil(wait, absl::Milliseconds(1)));
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
  FairSlots::Refusal refused_by;
  if (absl::Status status = streams_.Acquire(tenant, Now(), &refused_by); !status.ok()) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, RefusalLimit(refused_by));
    return status;
  }
  if (metrics_ != nullptr) metrics_->inflight_streams().Set(streams_.held());
  Ticket ticket;
  ticket.owner_ = this;
  ticket.tenant_ = tenant;
  ticket.stream_ = true;
  return ticket;
}

const char* Admission::RefusalLimit(FairSlots::Refusal refusal) {
  switch (refusal) {
    case FairSlots::Refusal::kLimit:
      return "concurrent_streams";
    case FairSlots::Refusal::kCap:
      return "tenant_concurrent_streams";
    default:
      return "fair_share";
  }
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
    absl::Status refused =
        absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes but the server holds ", bytes_,
                                                  " of its ", options_.max_inflight_bytes,
                                                  " in flight (--max-inflight-bytes); retry later or send less"));
    // Transient only while other calls hold bytes: more than the whole limit never fits.
    return bytes <= options_.max_inflight_bytes ? MarkRetryAfter(std::move(refused), kBusyRetryAfter) : refused;
  }
  if (bytes > options_.max_tenant_inflight_bytes - tenant_total) {
    *shortage = Short::kTenant;
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "tenant_inflight_bytes");
    // Transient only while the tenant's own calls hold bytes: more than the whole limit never fits.
    absl::Status refused = absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", bytes, " bytes but tenant \"", BoundedText(tenant), "\" holds ", tenant_total,
                     " of its ", options_.max_tenant_inflight_bytes, " in flight (--max-tenant-inflight-bytes)"));
    return bytes <= options_.max_tenant_inflight_bytes ? MarkRetryAfter(std::move(refused), kBusyRetryAfter)
                                                        : refused;
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
    streams_.Release(tenant);
    if (metrics_ != nullptr) metrics_->inflight_streams().Set(streams_.held());
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
