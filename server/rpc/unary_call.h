// One Orthogonalize (unary) call on gRPC's callback API: a one-message step through the same
// step layer as a stream (server/step/step.h), so that a unary call on a fleet is planned over
// the fleet like a lone stream. No thread is held while it waits or computes.
//
// Slots: the call first takes a unary slot (UnaryGate: fair between tenants, a bounded queue).
//
// Bounded memory: the call is served by the generic callback service (a raw byte stream), so
// that its body is read only once twice --max-message-bytes (its request and its response; at
// most the whole in-flight budget, server's or tenant's) of the budget is reserved for it (Admission::AddBytesWhenAvailable, in arrival
// order); until then gRPC holds no more of it than HTTP/2 flow control lets the client send.
// Once read, the reservation shrinks to what the call holds (its input and result bytes). The
// response refers to the result buffers rather than copying them (stream_codec.h). Every matrix is validated (sizes,
// data length, finiteness) before anything is computed; the first matrix that fails fails the
// call, as the proto says.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/convert/chunk_wire.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/rpc/service_state.h"

namespace orthoserve {

// The full method name the generic service routes to UnaryCall.
inline constexpr char kOrthogonalizeMethod[] = "/orthoserve.v1.Orthogonalizer/Orthogonalize";

class UnaryCall final : public grpc::ServerGenericBidiReactor,
                        public StepSink,
                        public ProgressWatchdog::Call,
                        public std::enable_shared_from_this<UnaryCall> {
 public:
  // Serves the call `context` (of kOrthogonalizeMethod).
  static grpc::ServerGenericBidiReactor* Start(ServiceState& state, grpc::CallbackServerContext* context);

  // grpc::ServerGenericBidiReactor.
  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // ProgressWatchdog::Call: a call whose request has not arrived within --stream-progress-timeout
  // of its room being reserved is ended (RESOURCE_EXHAUSTED), releasing that room.
  absl::Time stalled_since() const override;
  void ProgressTimedOut(absl::Duration stalled) override;

  // StepSink.
  void Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
              absl::string_view data, std::shared_ptr<const void> owner) override;
  void Finished(StepEnd end) override;

 private:
  struct Slot {
    absl::Status status = absl::UnknownError("no result");
    MatrixPlan plan;
    Block block;
    absl::string_view data;
    std::shared_ptr<const void> owner;  // Keeps `data`.
  };

  UnaryCall(ServiceState& state, grpc::CallbackServerContext* context);
  // Authenticates, then waits for a slot (UnaryGate), then for the body's reservation.
  void Begin();
  void OnSlot(absl::Status status);
  void Reserve();
  void OnReserved(absl::Status status);
  // Parses, validates, admits and runs the request; an error ends the call at once.
  absl::Status Run();
  // Ends the call with `status`, and the response when OK; only the first call counts.
  void End(absl::Status status);

  ServiceState& s_;
  grpc::CallbackServerContext* const context_;
  StepServices services_;
  grpc::ByteBuffer request_bytes_;          // The request as received, until the step has it.
  std::vector<MatrixInPlace> request_;       // Its matrices, the data viewed in request_bytes_.
  std::string call_id_;                      // Its call_id: the slices it leases are held under it.
  grpc::ByteBuffer response_bytes_;
  // Where matrix i's result was written, when its spec named a result_region (set by Run before
  // the step opens; empty when no matrix named one).
  std::vector<v1::RegionSlice> result_regions_;
  const absl::Time start_ = absl::Now();
  std::shared_ptr<UnaryCall> self_;  // gRPC's hold, until OnDone.
  std::string tenant_;
  UnaryGate::Slot slot_;
  Admission::Ticket bytes_;

  mutable absl::Mutex mu_;
  std::shared_ptr<Step> step_ ABSL_GUARDED_BY(mu_);
  uint64_t slot_wait_id_ ABSL_GUARDED_BY(mu_) = 0;  // The slot's wait while it waits.
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;       // The body's reservation while it waits.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // Its request is awaited (room reserved).
  absl::Time reading_since_ ABSL_GUARDED_BY(mu_);
  uint64_t watch_id_ = 0;  // Set before the read starts, read in OnDone.
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::Status status_;  // How the call ended (metrics): written once, by the End that ends it, before Finish.
};

}  // namespace orthoserve
