// One Orthogonalize (unary) call on gRPC's callback API: a one-message step through the same
// step layer as a stream (server/step/step.h), so that a unary call on a fleet is planned over
// the fleet like a lone stream. Every matrix is validated (sizes, data length, finiteness)
// before any byte is admitted or copied; the first matrix that fails fails the call, as the
// proto says. No thread is held while the step runs.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpcpp/support/server_callback.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/rpc/service_state.h"

namespace orthoserve {

class UnaryCall final : public grpc::ServerUnaryReactor, public StepSink, public std::enable_shared_from_this<UnaryCall> {
 public:
  // Serves `request` into `response` (both owned by gRPC until OnDone).
  static grpc::ServerUnaryReactor* Start(ServiceState& state, grpc::CallbackServerContext* context,
                                         const v1::OrthogonalizeRequest* request, v1::OrthogonalizeResponse* response);

  // grpc::ServerUnaryReactor.
  void OnCancel() override;
  void OnDone() override;

  // StepSink.
  void Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
              absl::string_view data, std::shared_ptr<const void> owner) override;
  void Finished(StepEnd end) override;

 private:
  struct Slot {
    absl::Status status = absl::UnknownError("no result");
    MatrixPlan plan;
    Block block;
    std::string data;
  };

  UnaryCall(ServiceState& state, grpc::CallbackServerContext* context, const v1::OrthogonalizeRequest* request,
            v1::OrthogonalizeResponse* response);
  // Validates, admits and runs the request; an error ends the call at once.
  absl::Status Begin();
  void End(absl::Status status);

  ServiceState& s_;
  grpc::CallbackServerContext* const context_;
  const v1::OrthogonalizeRequest* const request_;
  v1::OrthogonalizeResponse* const response_;
  StepServices services_;
  const absl::Time start_ = absl::Now();
  std::shared_ptr<UnaryCall> self_;  // gRPC's hold, until OnDone.
  std::string tenant_;
  Admission::Ticket bytes_;

  std::mutex mu_;
  std::shared_ptr<Step> step_;
  bool cancelled_ = false;
  std::vector<Slot> slots_;
  absl::Status status_;  // How the call ended (metrics).
};

}  // namespace orthoserve
