// A client call on gRPC's callback API that the test holds open: it sends at most one message
// (none: a unary call whose request never comes; a StepHeader: a stream that then waits) and no
// half-close, and reads until the server ends the call or Cancel(). For tests of what the
// server does with calls that wait on their client (progress timeouts, stream slots).
#pragma once

#include <mutex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"
#include "proto/convert/raw_message.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {

inline constexpr char kStreamMethod[] = "/orthoserve.v1.Orthogonalizer/OrthogonalizeStream";
inline constexpr char kUnaryMethod[] = "/orthoserve.v1.Orthogonalizer/Orthogonalize";

class HeldCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Calls `method`; sends `first` when it is not null; `token` non-empty: as that bearer token.
  HeldCall(grpc::GenericStub& stub, const char* method, const v1::StreamRequest* first, const std::string& token = "") {
    if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
    stub.PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    if (first != nullptr) {
      first_ = SerializeToByteBuffer(*first);
      StartWrite(&first_);
    }
    StartRead(&response_);
    StartCall();
  }
  // A stream that sends its StepHeader (one matrix, lone) and then waits.
  static std::unique_ptr<HeldCall> HeaderOnlyStream(grpc::GenericStub& stub, const std::string& token = "") {
    const v1::StreamRequest header = HeaderMessage(1);
    return std::make_unique<HeldCall>(stub, kStreamMethod, &header, token);
  }
  // A unary call whose request never comes.
  static std::unique_ptr<HeldCall> SilentUnary(grpc::GenericStub& stub) {
    return std::make_unique<HeldCall>(stub, kUnaryMethod, nullptr);
  }

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  grpc::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer first_;
  grpc::ByteBuffer response_;
  std::mutex mu_;
  bool done_ = false;
  grpc::Status status_;
};

// Waits up to `limit` for `done`; true when it held.
template <typename F>
bool WaitFor(F done, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

}  // namespace orthoserve::testing
