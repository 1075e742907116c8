// One client bidirectional gRPC stream driven through a private completion queue, so that every
// step (start, write, read, finish) waits with a deadline. The Lease keep-alive and Watch
// streams of etcd are long-lived: a blocking synchronous Read could not be bounded.
//
// Contract: one thread drives a BidiCall (Start, Write, Read, Finish); Cancel may be called
// from any thread and makes every pending step complete promptly with a failure. At most one
// read and one write are in flight; a Read that times out stays pending and the next Read
// keeps waiting for it. The destructor cancels the call and waits for every pending step, so
// no completion outlives the object.
#pragma once

#include <array>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_stream.h"
#include "proto/convert/grpc_status.h"

namespace orthoserve::etcd {

template <typename Request, typename Response>
class BidiCall {
 public:
  using Stream = grpc::ClientAsyncReaderWriter<Request, Response>;
  // Prepares (does not start) the call: a stub's PrepareAsync<Method>.
  using Prepare = std::function<std::unique_ptr<Stream>(grpc::ClientContext*, grpc::CompletionQueue*)>;

  explicit BidiCall(const Prepare& prepare) : stream_(prepare(&context_, &cq_)) {}

  BidiCall(const BidiCall&) = delete;
  BidiCall& operator=(const BidiCall&) = delete;

  ~BidiCall() {
    context_.TryCancel();
    if (started_ && !finished_) {
      stream_->Finish(&final_status_, Tag(kFinish));
      pending_[kFinish] = true;
    }
    // After TryCancel every pending step completes at once; the bound only guards a bug.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (int op = 0; op < kOps; ++op) {
      while (pending_[op] && Next(deadline) == Wait::kGot) {
      }
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Starts the call. UNAVAILABLE when it could not be started by `deadline`.
  absl::Status Start(absl::Time deadline) {
    started_ = true;
    stream_->StartCall(Tag(kStart));
    pending_[kStart] = true;
    if (!WaitFor(kStart, deadline)) return absl::UnavailableError("stream did not start in time");
    if (!ok_[kStart]) return absl::UnavailableError("stream start failed");
    return absl::OkStatus();
  }

  // Sends `request`. UNAVAILABLE when the stream is broken or the write was not done by
  // `deadline` (then the stream is cancelled: drop it).
  absl::Status Write(const Request& request, absl::Time deadline) {
    stream_->Write(request, Tag(kWrite));
    pending_[kWrite] = true;
    if (!WaitFor(kWrite, deadline)) {
      Cancel();
      return absl::UnavailableError("stream write timed out");
    }
    if (!ok_[kWrite]) return absl::UnavailableError("stream write failed (stream broken)");
    return absl::OkStatus();
  }

  // Receives the next response into `*response`. DEADLINE_EXCEEDED when none came by
  // `deadline` (the read stays pending; call Read again to go on waiting); UNAVAILABLE when
  // the stream has ended (call Finish for the reason).
  absl::Status Read(Response* response, absl::Time deadline) {
    if (!pending_[kRead]) {
      stream_->Read(&read_buffer_, Tag(kRead));
      pending_[kRead] = true;
    }
    if (!WaitFor(kRead, deadline)) return absl::DeadlineExceededError("no response yet");
    if (!ok_[kRead]) return absl::UnavailableError("stream ended");
    *response = std::move(read_buffer_);
    read_buffer_.Clear();
    return absl::OkStatus();
  }

  // The call's final status (cancels first when the server has not ended it by `deadline`).
  absl::Status Finish(absl::Time deadline) {
    if (!started_ || finished_) return absl::FailedPreconditionError("stream not running");
    stream_->Finish(&final_status_, Tag(kFinish));
    pending_[kFinish] = true;
    if (!WaitFor(kFinish, deadline)) {
      context_.TryCancel();
      WaitFor(kFinish, absl::Now() + absl::Seconds(30));
    }
    finished_ = true;
    return FromGrpcStatus(final_status_);
  }

  // Cancels the call; thread-safe.
  void Cancel() { context_.TryCancel(); }

  grpc::ClientContext& context() { return context_; }

 private:
  enum Op { kStart = 0, kWrite = 1, kRead = 2, kFinish = 3, kOps = 4 };
  enum class Wait { kGot, kTimeout, kShutdown };

  static void* Tag(Op op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op + 1)); }

  // Takes one completion off the queue, waiting until `deadline`.
  Wait Next(absl::Time deadline) {
    void* tag = nullptr;
    bool ok = false;
    switch (cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline))) {
      case grpc::CompletionQueue::GOT_EVENT: {
        const int op = static_cast<int>(reinterpret_cast<intptr_t>(tag)) - 1;
        pending_[op] = false;
        ok_[op] = ok;
        return Wait::kGot;
      }
      case grpc::CompletionQueue::TIMEOUT:
        return Wait::kTimeout;
      case grpc::CompletionQueue::SHUTDOWN:
        break;
    }
    return Wait::kShutdown;
  }

  // Waits until step `op` has completed (true) or `deadline` passed (false).
  bool WaitFor(Op op, absl::Time deadline) {
    while (pending_[op]) {
      if (Next(deadline) != Wait::kGot) return false;
    }
    return true;
  }

  // Declared first: the queue outlives the context and the stream bound to it.
  grpc::CompletionQueue cq_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  std::array<bool, kOps> pending_{};
  std::array<bool, kOps> ok_{};
  bool started_ = false;
  bool finished_ = false;
  Response read_buffer_;
  grpc::Status final_status_;
};

}  // namespace orthoserve::etcd
