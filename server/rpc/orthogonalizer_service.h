// The public orthoserve.v1.Orthogonalizer service: a thin adapter that authenticates, admits,
// parses and validates requests, hands each step to the step layer (server/step), and streams
// results back (stream_call.h, unary_call.h). All numerics live in server/engine and
// server/distributed. Thread-safe; one instance serves every RPC.
#pragma once

#include <memory>

#include "common/fair_pool.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/engine/backend.h"
#include "server/fleet/fleet.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/service_state.h"

namespace orthoserve {

// Orthogonalize and OrthogonalizeStream on gRPC's callback API (the stream on raw byte buffers,
// stream_codec.h); GetServerInfo synchronous.
using OrthogonalizerServiceBase = v1::Orthogonalizer::WithCallbackMethod_Orthogonalize<
    v1::Orthogonalizer::WithRawCallbackMethod_OrthogonalizeStream<v1::Orthogonalizer::Service>>;

class OrthogonalizerService final : public OrthogonalizerServiceBase {
 public:
  // None of the pointers is owned; all must outlive the service.
  OrthogonalizerService(const ServiceOptions& options, Backend* backend, Fleet* fleet, Metrics* metrics,
                        const TokenAuth* auth, FairPool* compute);

  grpc::ServerUnaryReactor* Orthogonalize(grpc::CallbackServerContext* context, const v1::OrthogonalizeRequest* request,
                                          v1::OrthogonalizeResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OrthogonalizeStream(
      grpc::CallbackServerContext* context) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

  // New calls are refused with UNAVAILABLE from now on; calls in progress finish.
  void StartDraining() { state_->draining.store(true); }
  // RPCs in progress.
  int inflight() const { return state_->inflight.load(); }

 private:
  Backend* backend_;
  Fleet* fleet_;
  std::unique_ptr<ServiceState> state_;
};

}  // namespace orthoserve
