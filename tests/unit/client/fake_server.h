// An in-process stand-in for an orthoserve rank that speaks the public protocol exactly but
// "computes" 2·X (in fp32, returned in the result dtype), so client tests can check the data
// path, chunking, errors, metadata, retries and fleet routing without the real engine.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"

namespace orthoserve::client::testing {

// Behaviour knobs are set before the first call; counters are read after calls return.
class FakeOrthogonalizer final : public v1::Orthogonalizer::Service {
 public:
  int64_t chunk_bytes = 1000;  // Advertised limit; chunks sent back are this size.
  std::string required_token;  // When set, calls without "Bearer <token>" are UNAUTHENTICATED.
  int fleet_rank = 0;
  std::vector<std::string> members;  // Advertised fleet (fleet_world = size, or 1 when empty).
  // When set, the stream waits on it after sending result 0 (shared: a handler may still be
  // leaving the wait when the test's copy goes away).
  std::shared_ptr<absl::Notification> gate;
  bool send_extra_byte = false;  // Protocol violation: one byte more than the block.
  // Results echo MatrixSpec.nd_layout, as servers do since it exists; false: an older server.
  bool echo_nd_layout = true;
  // Results echo NsOptions.normalization (bf16), as servers do since it exists; false: an older server.
  bool echo_normalization = true;
  // A server that answers with another matrix's or another rank's result: results name
  // `result_name` (when not empty) and their block is moved down by `result_row_shift` rows.
  std::string result_name;
  int64_t result_row_shift = 0;

  // Failure injection: the next `fail_streams` OrthogonalizeStream calls (`fail_unary` Orthogonalize,
  // `fail_info` GetServerInfo calls) fail with `fail_code` and "injected failure", with the
  // trailing metadata `orthoserve-retryable: fleet-change` when `fail_fleet_change`. A stream fails
  // right after its header, or after it sent every matrix's result when `fail_after_results`.
  std::atomic<int> fail_streams{0};
  std::atomic<int> fail_unary{0};
  std::atomic<int> fail_info{0};
  grpc::StatusCode fail_code = grpc::StatusCode::UNAVAILABLE;
  bool fail_fleet_change = false;
  bool fail_after_results = false;

  // Stalls: the next `stall_streams` OrthogonalizeStream calls (`stall_unary` Orthogonalize,
  // `stall_info` GetServerInfo calls) never answer: each waits until the client's deadline or
  // cancel (a minute at most) and is counted in `stalled`, as a server that hangs would.
  std::atomic<int> stall_streams{0};
  std::atomic<int> stall_unary{0};
  std::atomic<int> stall_info{0};
  std::atomic<int> stalled{0};

  std::atomic<int> streams{0};
  std::atomic<int> unary_calls{0};
  std::atomic<int> info_calls{0};
  std::atomic<int64_t> largest_chunk_received{0};
  absl::Mutex mu;
  std::string last_authorization ABSL_GUARDED_BY(mu);
  v1::StepHeader last_header ABSL_GUARDED_BY(mu);
  std::vector<int> attempts ABSL_GUARDED_BY(mu);  // StepHeader.attempt of every stream, in order.
  // members[r].ready as advertised (empty: every member ready) and the fleet generation; may be
  // changed while serving.
  std::vector<bool> member_ready ABSL_GUARDED_BY(mu);
  int64_t fleet_generation ABSL_GUARDED_BY(mu) = 1;

  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* info) override;
  grpc::Status Orthogonalize(grpc::ServerContext* context, const v1::OrthogonalizeRequest* request,
                             v1::OrthogonalizeResponse* response) override;
  grpc::Status OrthogonalizeStream(grpc::ServerContext* context,
                                   grpc::ServerReaderWriter<v1::StreamResponse, v1::StreamRequest>* stream) override;

 private:
  grpc::Status CheckAuth(grpc::ServerContext* context);
  // The injected failure when `budget` (one of the fail_* counters) is not spent; OK otherwise.
  grpc::Status TakeFailure(std::atomic<int>& budget, grpc::ServerContext* context);
  // When `budget` is not spent: waits while the call lives, then returns true.
  bool Stall(std::atomic<int>& budget, grpc::ServerContext* context);
};

// A running server on 127.0.0.1:<ephemeral port> with the fake service and the default health
// service.
struct FakeServer {
  std::unique_ptr<FakeOrthogonalizer> service = std::make_unique<FakeOrthogonalizer>();
  std::unique_ptr<grpc::Server> server;
  std::string address;

  // Starts serving (plaintext unless `credentials` are given); configure `service` first.
  void Start(const std::shared_ptr<grpc::ServerCredentials>& credentials = nullptr);
  ~FakeServer();
};

}  // namespace orthoserve::client::testing
