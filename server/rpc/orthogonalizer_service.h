// The public orthoserve.v1.Orthogonalizer service: a thin adapter that authenticates, admits,
// parses and validates requests, hands the work to the fleet (group steps) or to the local
// compute pool (lone clients), and streams results back. All numerics live in server/engine and
// server/distributed. Thread-safe; one instance serves every RPC.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/fair_pool.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/engine/backend.h"
#include "server/fleet/fleet.h"
#include "server/metrics/metrics.h"
#include "server/rpc/admission.h"
#include "server/rpc/auth.h"
#include "common/buffer_pool.h"

namespace orthoserve {

struct ServiceOptions {
  int64_t max_matrix_elements = int64_t{1} << 28;  // Per matrix (global shape).
  int64_t chunk_bytes = int64_t{4} << 20;          // Largest DataChunk accepted and sent.
  int64_t max_message_bytes = int64_t{64} << 20;   // gRPC message limit (reported in GetServerInfo).
  int max_matrices_per_step = 4096;                // num_matrices of one step or unary call.
  absl::Duration rendezvous_timeout = absl::Seconds(60);  // Reported in GetServerInfo.
  Admission::Options admission;
  // Reused stream buffers; max_idle_bytes is capped at admission.max_inflight_bytes.
  BufferPool::Options buffers;
  std::string version;
};

class OrthogonalizerService final : public v1::Orthogonalizer::Service {
 public:
  // None of the pointers is owned; all must outlive the service.
  OrthogonalizerService(const ServiceOptions& options, Backend* backend, Fleet* fleet, Metrics* metrics,
                        const TokenAuth* auth, FairPool* compute);

  grpc::Status Orthogonalize(grpc::ServerContext* context, const v1::OrthogonalizeRequest* request,
                             v1::OrthogonalizeResponse* response) override;
  // OrthogonalizeStream is served by OrthogonalizeRawStream (stream_step.cc) on raw byte
  // buffers, registered in the constructor in place of the generated protobuf handler.
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

  // New calls are refused with UNAVAILABLE from now on; calls in progress finish.
  void StartDraining() { draining_.store(true); }
  // RPCs in progress.
  int inflight() const { return inflight_.load(); }

 private:
  friend class StreamStep;
  using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  grpc::Status OrthogonalizeRawStream(grpc::ServerContext* context, RawStream* stream);
  absl::Status RunUnary(grpc::ServerContext* context, const v1::OrthogonalizeRequest& request,
                        v1::OrthogonalizeResponse& response);

  const ServiceOptions options_;
  Backend* backend_;
  Fleet* fleet_;
  Metrics* metrics_;
  const TokenAuth* auth_;
  FairPool* compute_;
  Admission admission_;
  std::shared_ptr<BufferPool> buffers_;
  std::atomic<bool> draining_{false};
  std::atomic<int> inflight_{0};
};

}  // namespace orthoserve
