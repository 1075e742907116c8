// Implementation of server/rpc/shared_memory_service.h.
#include "server/rpc/shared_memory_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/message_text.h"
#include "proto/convert/grpc_status.h"

namespace orthoserve {
namespace {

void ToProto(const RegionInfo& info, v1::Region* region) {
  region->set_region_id(info.id);
  region->set_name(info.name);
  region->set_size(info.size);
  region->set_peer_pid(static_cast<int32_t>(info.peer.pid));
  region->set_peer_uid(static_cast<uint32_t>(info.peer.uid));
  region->set_users(info.users);
  region->set_cuda_device(info.cuda_device);
}

}  // namespace

SharedMemoryService::SharedMemoryService(RegionRegistry* registry, const TokenAuth* auth, Metrics* metrics,
                                         absl::Duration unregister_timeout, int max_name_bytes)
    : registry_(registry),
      auth_(auth),
      metrics_(metrics),
      unregister_timeout_(unregister_timeout),
      max_name_bytes_(max_name_bytes) {}

absl::StatusOr<std::string> SharedMemoryService::Tenant(const grpc::ServerContext& context) const {
  if (registry_ == nullptr) {
    return absl::FailedPreconditionError(
        "shared-memory regions are off on this server (start it with --shm-socket to allow them)");
  }
  return auth_->Authenticate(context);
}

void SharedMemoryService::PublishTotals(const RegionRegistry& registry, Metrics* metrics) {
  if (metrics == nullptr) return;
  const RegionRegistry::Totals totals = registry.totals();
  metrics->ShmRegions("host", totals.host_regions, totals.host_bytes);
  metrics->ShmRegions("cuda", totals.cuda_regions, totals.cuda_bytes);
}

void SharedMemoryService::UpdateMetrics() { PublishTotals(*registry_, metrics_); }

grpc::Status SharedMemoryService::RegisterRegion(grpc::ServerContext* context, const v1::RegisterRegionRequest* request,
                                                 v1::Region* response) {
  absl::StatusOr<std::string> tenant = Tenant(*context);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::StatusOr<RegionInfo> info = registry_->Claim(*tenant, request->ticket(), request->name());
  if (!info.ok()) return ToGrpcStatus(info.status());
  UpdateMetrics();
  LOG_INFO("shm") << "tenant " << BoundedText(*tenant) << " registered a region of " << info->size << " bytes "
                  << (info->cuda_device.empty() ? "of host memory" : "on " + info->cuda_device) << " from pid "
                  << info->peer.pid;
  ToProto(*info, response);
  return grpc::Status::OK;
}

grpc::Status SharedMemoryService::ListRegions(grpc::ServerContext* context, const v1::ListRegionsRequest*,
                                              v1::ListRegionsResponse* response) {
  absl::StatusOr<std::string> tenant = Tenant(*context);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  for (const RegionInfo& info : registry_->List(*tenant)) ToProto(info, response->add_regions());
  return grpc::Status::OK;
}

grpc::Status SharedMemoryService::UnregisterRegion(grpc::ServerContext* context,
                                                   const v1::UnregisterRegionRequest* request,
                                                   v1::UnregisterRegionResponse*) {
  absl::StatusOr<std::string> tenant = Tenant(*context);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  const absl::Time deadline = std::min(absl::FromChrono(context->deadline()), absl::Now() + unregister_timeout_);
  absl::Status status = registry_->Unregister(*tenant, request->region_id(), deadline);
  // The region left the registry unless it was not found (even when the wait ran out).
  if (status.code() != absl::StatusCode::kNotFound) UpdateMetrics();
  return ToGrpcStatus(status);
}

grpc::Status SharedMemoryService::FenceCall(grpc::ServerContext* context, const v1::FenceCallRequest* request,
                                            v1::FenceCallResponse*) {
  // A server without regions holds no call's slices: every call is fenced already.
  absl::StatusOr<std::string> tenant = registry_ == nullptr ? auth_->Authenticate(*context) : Tenant(*context);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  if (registry_ == nullptr) return grpc::Status::OK;
  if (request->call_id().size() > static_cast<size_t>(max_name_bytes_)) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("call_id has ", request->call_id().size(),
                                                                " bytes; at most ", max_name_bytes_,
                                                                " are accepted (--max-name-bytes)")));
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = std::min(absl::FromChrono(context->deadline()), start + unregister_timeout_);
  absl::Status status = registry_->FenceCall(*tenant, request->call_id(), deadline);
  const absl::Duration waited = absl::Now() - start;
  if (waited > absl::Milliseconds(100) || !status.ok()) {
    LOG_INFO("shm") << "tenant " << BoundedText(*tenant) << " fenced call " << BoundedText(request->call_id()) << " after "
                    << absl::FormatDuration(waited) << ": " << status;
  }
  if (metrics_ != nullptr) metrics_->ShmFence(absl::StatusCodeToString(status.code()), waited);
  return ToGrpcStatus(status);
}

}  // namespace orthoserve
