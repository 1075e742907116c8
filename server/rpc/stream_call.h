// One OrthogonalizeStream call on gRPC's callback API: it authenticates and admits the call,
// parses each message as it is read (stream_codec.h: chunk bytes are viewed where gRPC received
// them), admits each matrix's bytes and feeds the step layer (server/step/step.h); the step's
// results come back through StepSink and are written in the order they were produced, each
// write started when the previous one is done. No thread is held by a call: reads, writes and
// cancellation arrive as events, so idle streams cost memory, not threads.
//
// Lifetime: gRPC holds the reactor from Start until OnDone; the step's work in flight (compute
// jobs, a group step in the fleet) holds it as its sink for as long as that work runs, and the
// call drops everything the sink receives once it has finished.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/rpc/service_state.h"
#include "server/rpc/stream_codec.h"

namespace orthoserve {

class StreamCall final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                         public StepSink,
                         public ProgressWatchdog::Call,
                         public std::enable_shared_from_this<StreamCall> {
 public:
  // Serves the call `context` of the service `state`.
  static grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Start(ServiceState& state,
                                                                           grpc::CallbackServerContext* context);

  // grpc::ServerBidiReactor.
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // StepSink.
  void Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
              absl::string_view data, std::shared_ptr<const void> owner) override;
  void Finished(StepEnd end) override;

  // ProgressWatchdog::Call.
  absl::Time stalled_since() const override;
  void ProgressTimedOut(absl::Duration stalled) override;

 private:
  struct Out {
    grpc::ByteBuffer message;
    double data_bytes = 0;  // Result bytes in this message (metrics once written).
  };

  StreamCall(ServiceState& state, grpc::CallbackServerContext* context);
  void Begin();
  absl::Status Admit();
  void ReadNext();
  // Handles the message just read; false when no more messages are wanted.
  bool Handle();
  bool OnHeader();
  bool OnSpec(const v1::MatrixSpec& spec);
  bool OnChunk(int index);
  // Half-close, or a broken read.
  void InputEnded();
  // Fails the call: through the step when there is one (it finishes the call), at once otherwise.
  void Fail(absl::Status status);
  void Enqueue(std::vector<grpc::ByteBuffer> messages, double data_bytes);
  // Finishes the call with `status` once everything queued is written (at once if the stream broke).
  void RequestFinish(absl::Status status, bool retryable = false);
  void DoFinish();

  ServiceState& s_;
  grpc::CallbackServerContext* const context_;
  StepServices services_;
  const SpecLimits spec_limits_;
  const absl::Time start_ = absl::Now();
  std::shared_ptr<StreamCall> self_;  // gRPC's hold, until OnDone.
  uint64_t watch_id_ = 0;

  // Reader's state (one read at a time).
  StreamRequestView request_;
  std::string tenant_;
  int world_ = 1;
  int specs_ = 0;
  int64_t result_chunk_bytes_ = kDefaultResultChunkBytes;
  Admission::Ticket stream_slot_;
  Admission::Ticket bytes_;

  mutable std::mutex mu_;
  std::shared_ptr<Step> step_;
  bool cancelled_ = false;
  bool reading_ = false;  // A read is outstanding while the step still wants input.
  absl::Time reading_since_;
  std::deque<Out> queue_;  // queue_.front() is being written while writing_.
  bool writing_ = false;
  absl::Time write_progress_;  // The last write started or done.
  bool broken_ = false;        // A write failed: the client is gone.
  int results_ok_ = 0;
  int results_failed_ = 0;
  bool finish_wanted_ = false;
  bool finish_started_ = false;
  absl::Status finish_status_;
  bool finish_retryable_ = false;
};

}  // namespace orthoserve
