// The public orthoserve.v1.SharedMemory service: register, list and unregister the caller's
// tenant's shared-memory regions (docs/shared_memory.md). A thin adapter over RegionRegistry
// (server/shm): it authenticates the caller, converts messages and statuses, and keeps the
// region metrics current. Thread-safe; synchronous handlers.
#pragma once

#include "absl/time/time.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/shm/region_registry.h"

namespace orthoserve {

class SharedMemoryService final : public v1::SharedMemory::Service {
 public:
  // `registry` null: regions are off (no --shm-socket), and every call is FAILED_PRECONDITION.
  // An unregister (or a fence) waits for the steps using the region (the call) until the call's
  // deadline or `unregister_timeout`, whichever comes first. None of the pointers is owned; all outlive the
  // service.
  SharedMemoryService(RegionRegistry* registry, const TokenAuth* auth, Metrics* metrics,
                      absl::Duration unregister_timeout, int max_name_bytes);

  grpc::Status RegisterRegion(grpc::ServerContext* context, const v1::RegisterRegionRequest* request,
                              v1::Region* response) override;
  grpc::Status ListRegions(grpc::ServerContext* context, const v1::ListRegionsRequest* request,
                           v1::ListRegionsResponse* response) override;
  grpc::Status UnregisterRegion(grpc::ServerContext* context, const v1::UnregisterRegionRequest* request,
                                v1::UnregisterRegionResponse* response) override;
  // Waits, up to the call's deadline or `unregister_timeout`, until the caller's call holds no
  // slice (RegionRegistry::FenceCall).
  grpc::Status FenceCall(grpc::ServerContext* context, const v1::FenceCallRequest* request,
                         v1::FenceCallResponse* response) override;

  // Sets the region gauges of `metrics` (may be null) to `registry`'s totals. Thread-safe.
  static void PublishTotals(const RegionRegistry& registry, Metrics* metrics);

 private:
  // The caller's tenant, or why not: FAILED_PRECONDITION when regions are off, UNAUTHENTICATED.
  absl::StatusOr<std::string> Tenant(const grpc::ServerContext& context) const;
  void UpdateMetrics();

  RegionRegistry* const registry_;
  const TokenAuth* const auth_;
  Metrics* const metrics_;
  const absl::Duration unregister_timeout_;
  const int max_name_bytes_;  // Of a call id (--max-name-bytes).
};

}  // namespace orthoserve
