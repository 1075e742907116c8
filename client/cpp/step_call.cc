// Implementation of client/cpp/step_call.h.
#include "client/cpp/step_call.h"

#include <utility>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/stub_options.h"
#include "proto/convert/raw_message.h"

namespace orthoserve::client {

StepCall::StepCall(grpc::ClientContext* context, std::unique_ptr<StepRequests> requests, BufferPool* send_buffers)
    : context_(context), send_buffers_(send_buffers), requests_(std::move(requests)) {}

StepCall::~StepCall() {
  if (started_ && !finished_) Finish();
}

void StepCall::Start(const std::shared_ptr<grpc::Channel>& channel) {
  started_ = true;
  grpc::GenericStub stub(channel);
  stub.PrepareBidiStreamingCall(context_, kStreamMethod, grpc::StubOptions(), this);
  // The caller's thread starts reads (Next) after StartCall, outside the reactions: the hold keeps
  // the call (and OnDone) from ending until Finish says no more reads will be started.
  AddHold();
  StreamResponseView* target;
  {
    absl::MutexLock lock(&mu_);
    reading_ = std::make_unique<StreamResponseView>();
    target = reading_.get();
  }
  StartRead(&target->raw);
  WriteNext();
  StartCall();
}

void StepCall::WriteNext() {
  std::optional<StepRequests::Request> request = requests_->Next();
  if (!request.has_value()) return;
  if (request->message != nullptr) {
    write_buffer_ = SerializeToByteBuffer(*request->message);
  } else {
    absl::StatusOr<grpc::ByteBuffer> chunk = ChunkRequest(request->chunk_index, request->chunk_data, *send_buffers_);
    if (!chunk.ok()) {
      {
        absl::MutexLock lock(&mu_);
        send_error_ = chunk.status();
      }
      context_->TryCancel();
      return;
    }
    write_buffer_ = *std::move(chunk);
  }
  last_written_ = request->last;
  if (last_written_) {
    StartWriteLast(&write_buffer_, grpc::WriteOptions());
  } else {
    StartWrite(&write_buffer_);
  }
}

void StepCall::OnWriteDone(bool ok) {
  // Not ok: the stream broke; its status (read by Finish) says why.
  if (ok && !last_written_) WriteNext();
}

void StepCall::OnReadDone(bool ok) {
  StreamResponseView* target = nullptr;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<StreamResponseView> read = std::move(reading_);
    if (!ok) {
      reads_ended_ = true;
      return;
    }
    if (reading_stopped_) return;  // The caller takes no more responses.
    received_.push_back(std::move(read));
    if (received_.size() >= kMaxQueued) {
      read_paused_ = true;
      return;
    }
    reading_ = std::make_unique<StreamResponseView>();
    target = reading_.get();
  }
  StartRead(&target->raw);
}

std::unique_ptr<StreamResponseView> StepCall::Next() {
  StreamResponseView* target = nullptr;
  std::unique_ptr<StreamResponseView> response;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &StepCall::ResponseReady));
    if (received_.empty()) return nullptr;
    response = std::move(received_.front());
    received_.pop_front();
    if (read_paused_) {
      read_paused_ = false;
      reading_ = std::make_unique<StreamResponseView>();
      target = reading_.get();
    }
  }
  // Outside the lock: gRPC may run OnReadDone before StartRead returns.
  if (target != nullptr) StartRead(&target->raw);
  return response;
}

bool StepCall::ResponseReady() const { return !received_.empty() || reads_ended_; }

grpc::Status StepCall::Finish() {
  finished_ = true;
  {
    absl::MutexLock lock(&mu_);
    reading_stopped_ = true;
    received_.clear();
  }
  RemoveHold();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

absl::Status StepCall::send_error() const {
  absl::MutexLock lock(&mu_);
  return send_error_;
}

void StepCall::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

}  // namespace orthoserve::client
