// The public orthoserve.v1.Orthogonalizer service: a thin adapter that authenticates, admits,
// parses and validates requests, hands each step to the step layer (server/step), and streams
// results back (stream_call.h, unary_call.h). All numerics live in server/engine and
// server/distributed. Thread-safe; one instance serves every RPC.
#pragma once

#include <memory>

#include "common/fair_pool.h"
#include "grpcpp/generic/async_generic_service.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "server/engine/backend.h"
#include "server/fleet/wire/fleet.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/service_state.h"

namespace orthoserve {

// OrthogonalizeStream on gRPC's callback API on raw byte buffers (stream_codec.h); Orthogonalize
// through the generic callback service (generic_service(), which the server must register), so
// that its body is read only once admitted (unary_call.h); GetServerInfo synchronous.
using OrthogonalizerServiceBase = v1::Orthogonalizer::WithGenericMethod_Orthogonalize<
    v1::Orthogonalizer::WithRawCallbackMethod_OrthogonalizeStream<v1::Orthogonalizer::Service>>;

class OrthogonalizerService final : public OrthogonalizerServiceBase {
 public:
  // None of the pointers is owned; all must outlive the service. `regions` null: shared-memory
  // regions are off (a matrix naming one is FAILED_PRECONDITION).
  OrthogonalizerService(const ServiceOptions& options, Backend* backend, Fleet* fleet, Metrics* metrics,
                        const TokenAuth* auth, FairPool* compute, RegionRegistry* regions = nullptr);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OrthogonalizeStream(
      grpc::CallbackServerContext* context) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

  // Serves Orthogonalize (and answers UNIMPLEMENTED for any method no service knows). The
  // server registers it with ServerBuilder::RegisterCallbackGenericService.
  grpc::CallbackGenericService* generic_service() { return &generic_; }

  // New calls are refused with UNAVAILABLE from now on; calls in progress finish.
  void StartDraining() { state_->draining.store(true); }
  // RPCs in progress.
  int inflight() const { return state_->inflight.load(); }

 private:
  class Generic final : public grpc::CallbackGenericService {
   public:
    explicit Generic(OrthogonalizerService& service) : service_(service) {}
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

   private:
    OrthogonalizerService& service_;
  };

  Backend* backend_;
  Fleet* fleet_;
  std::unique_ptr<ServiceState> state_;
  Generic generic_{*this};
};

}  // namespace orthoserve
