// Implementation of server/rpc/admission.h.
#include "server/rpc/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace orthoserve {

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

absl::StatusOr<Admission::Ticket> Admission::AcquireStream(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_ >= options_.max_concurrent_streams) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "concurrent_streams");
    return absl::ResourceExhaustedError(absl::StrCat("the server is serving ", streams_, " streams, its limit of ",
                                                     options_.max_concurrent_streams,
                                                     " concurrent streams (--max-concurrent-streams); retry later"));
  }
  int& mine = tenant_streams_[tenant];
  if (options_.max_tenant_concurrent_streams > 0 && mine >= options_.max_tenant_concurrent_streams) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "tenant_concurrent_streams");
    return absl::ResourceExhaustedError(absl::StrCat("tenant \"", tenant, "\" has ", mine, " streams open, its limit of ",
                                                     options_.max_tenant_concurrent_streams,
                                                     " (--max-tenant-concurrent-streams); close one or retry later"));
  }
  ++streams_;
  ++mine;
  if (metrics_ != nullptr) metrics_->inflight_streams().Set(streams_);
  Ticket ticket;
  ticket.owner_ = this;
  ticket.tenant_ = tenant;
  ticket.stream_ = true;
  return ticket;
}

absl::Status Admission::AddBytes(Ticket& ticket, const std::string& tenant, int64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ticket.owner_ != nullptr && ticket.tenant_ != tenant) {
    return absl::InternalError(absl::StrCat("admission ticket of tenant \"", ticket.tenant_,
                                            "\" used for tenant \"", tenant, "\""));
  }
  int64_t& tenant_total = tenant_bytes_[tenant];
  if (bytes > options_.max_inflight_bytes - bytes_) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "inflight_bytes");
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes but the server holds ", bytes_,
                                                     " of its ", options_.max_inflight_bytes,
                                                     " in flight (--max-inflight-bytes); retry later or send less"));
  }
  if (bytes > options_.max_tenant_inflight_bytes - tenant_total) {
    if (metrics_ != nullptr) metrics_->TenantRefused(tenant, "tenant_inflight_bytes");
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes but tenant \"", tenant,
                                                     "\" holds ", tenant_total, " of its ",
                                                     options_.max_tenant_inflight_bytes,
                                                     " in flight (--max-tenant-inflight-bytes)"));
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

void Admission::Return(const std::string& tenant, int64_t bytes, bool stream) {
  std::lock_guard<std::mutex> lock(mu_);
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
  }
}

int64_t Admission::LargestTenantBytesLocked() const {
  int64_t largest = 0;
  for (const auto& [tenant, bytes] : tenant_bytes_) largest = std::max(largest, bytes);
  return largest;
}

int64_t Admission::inflight_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace orthoserve
