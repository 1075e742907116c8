// One OrthogonalizeStream call on gRPC's public callback API (grpc::GenericStub with raw byte
// buffers, step_codec.h), for Client::Step: the step's requests are written by gRPC's callback
// threads, each started when the previous write is done, while the caller reads the responses on
// its own thread. No thread is spent per stream.
#pragma once

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/step_codec.h"
#include "client/cpp/step_protocol.h"
#include "common/buffer_pool.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/status.h"

namespace orthoserve::client {

// The full name of the streaming method (the generic stub opens it by name).
inline constexpr char kStreamMethod[] = "/orthoserve.v1.Orthogonalizer/OrthogonalizeStream";

// Drives one call. Writes: every message of `requests` in order, the StepEnd with the end of the
// writes (StartWriteLast); a DataChunk is copied once into a buffer from `send_buffers`
// (ChunkRequest), other messages are serialized. Writing stops early when the stream breaks (the
// call's status says why) or when a chunk buffer cannot be allocated: then the call is cancelled
// and send_error() reports that. Reads: one read is outstanding while fewer than a few responses
// wait for the caller, so a slow caller holds the server back instead of queueing the step.
//
// Use, from one thread:
//   StepCall call(&context, std::move(requests), send_buffers);
//   call.Start(channel);
//   while (std::unique_ptr<StreamResponseView> response = call.Next()) { ... }
//   grpc::Status status = call.Finish();
// The caller may stop reading early (after context.TryCancel(), so that the call ends); Finish
// waits until gRPC is done with the call (OnDone), after which the trailing metadata in `context`
// may be read. `context`, the inputs behind `requests` and `send_buffers` must outlive Finish.
class StepCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StepCall(grpc::ClientContext* context, std::unique_ptr<StepRequests> requests, BufferPool* send_buffers);
  StepCall(const StepCall&) = delete;
  StepCall& operator=(const StepCall&) = delete;
  // Calls Finish when Start was called and Finish was not (it waits for the call to end).
  ~StepCall() override;

  // Opens the call on `channel` with the first write and read posted. Once.
  void Start(const std::shared_ptr<grpc::Channel>& channel);

  // The next response as received (not parsed), waiting for it; null when the server's responses
  // ended (or the call failed). Not after Finish.
  std::unique_ptr<StreamResponseView> Next();

  // Ends reading, then waits for the call to end and returns its status. Once, after Start.
  grpc::Status Finish();

  // RESOURCE_EXHAUSTED when a chunk buffer could not be allocated (the call was then cancelled);
  // OK otherwise. Meaningful after Finish.
  absl::Status send_error() const;

  // grpc::ClientBidiReactor; called by gRPC.
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Responses read ahead of the caller before reading pauses.
  static constexpr size_t kMaxQueued = 2;

  // Starts the write of the next request, if any. On the write chain only: from Start (before
  // StartCall) and from OnWriteDone.
  void WriteNext();
  // Next's wait: a response is queued or none will come.
  bool ResponseReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::ClientContext* const context_;
  BufferPool* const send_buffers_;
  // The write chain's state: touched by one write step at a time.
  const std::unique_ptr<StepRequests> requests_;
  grpc::ByteBuffer write_buffer_;  // The message being written (kept until OnWriteDone).
  bool last_written_ = false;      // write_buffer_ is the StepEnd.

  bool started_ = false;   // Caller's thread only.
  bool finished_ = false;  // Caller's thread only.

  mutable absl::Mutex mu_;
  std::unique_ptr<StreamResponseView> reading_ ABSL_GUARDED_BY(mu_);  // The outstanding read's target.
  std::deque<std::unique_ptr<StreamResponseView>> received_ ABSL_GUARDED_BY(mu_);
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;  // No read outstanding; Next starts the next one.
  bool reads_ended_ ABSL_GUARDED_BY(mu_) = false;  // A read failed: no more responses.
  bool reading_stopped_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called: start no more reads.
  absl::Status send_error_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran.
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve::client
