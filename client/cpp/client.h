// orthoserve C++ client: one channel to one server rank, with the unary, streaming, info and
// health calls of orthoserve.v1.Orthogonalizer (proto/orthoserve/v1/orthogonalizer.proto).
//
//   ASSIGN_OR_RETURN(auto client, Client::Create({.address = "127.0.0.1:50051"}));
//   ASSIGN_OR_RETURN(std::vector<MatrixOutput> out, client->Step(StepOptions{}, inputs));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/matrix.h"
#include "common/buffer_pool.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"

namespace orthoserve::client {

struct ClientOptions {
  std::string address = "127.0.0.1:50051";     // Server HOST:PORT (any gRPC target string).
  absl::Duration timeout = absl::Seconds(60);  // Deadline of each call; InfiniteDuration for none.
  int max_send_message_bytes = 256 << 20;      // Channel limit on one outgoing message; -1: none.
  int max_receive_message_bytes = 256 << 20;   // Channel limit on one incoming message; -1: none.
  size_t chunk_bytes = 0;                      // DataChunk size; 0: 4 MiB. Lowered to the server's limit.
  bool discover_limits = true;                 // Ask GetServerInfo for the chunk limit before the first Step.
  std::string tls_ca_file;                     // PEM roots; non-empty (or a cert) selects TLS.
  std::string tls_cert_file;                   // PEM client certificate for mutual TLS (with key).
  std::string tls_key_file;                    // PEM client private key for mutual TLS (with cert).
  std::string tls_server_name;                 // Overrides the name checked in the server cert.
  std::string bearer_token;                    // Sent as "authorization: Bearer <token>" when set.
};

// Called on the caller's thread as each matrix's result is complete, before Step returns.
using ResultCallback = std::function<void(const MatrixOutput&)>;

// Thread-safe: any number of calls may run at once on one Client.
class Client {
 public:
  // Builds the channel (it connects lazily; no RPC is made). INVALID_ARGUMENT for bad options
  // (empty address, cert without key, non-positive timeout); NOT_FOUND/PERMISSION_DENIED when a
  // TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);

  // Creates a client over an existing channel (in-process servers, tests). No TLS or token
  // handling beyond `options.bearer_token` and the per-call timeout.
  static std::unique_ptr<Client> CreateWithChannel(std::shared_ptr<grpc::Channel> channel,
                                                   const ClientOptions& options);

  // The server's description, fleet membership and limits. Remembers the limits for Step.
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // grpc.health.v1.Health/Check for the overall server (service ""). OK when SERVING;
  // UNAVAILABLE naming the state (NOT_SERVING, UNKNOWN, ...) otherwise; the RPC's status when the
  // call fails (UNIMPLEMENTED when the server has no health service).
  absl::Status Health();

  // Unary Orthogonalize of whole matrices. Returns one output per input, in order, with its
  // per-matrix status; the call's status (INVALID_ARGUMENT for a bad input, checked before
  // sending; the server's code and message otherwise) when it fails as a whole.
  absl::StatusOr<std::vector<MatrixOutput>> Orthogonalize(absl::Span<const MatrixInput> inputs);

  // One OrthogonalizeStream step. Sends the header, each spec and its chunked data from a second
  // thread while reading results on this one; results may arrive before every matrix is sent.
  // Returns one output per input, in input order, each with its per-matrix status; `on_result`
  // (optional) sees each as it completes. Stream-level failures return the stream's gRPC status
  // (code and server message); INTERNAL when the server breaks the protocol; INVALID_ARGUMENT for
  // a bad input (nothing is sent).
  absl::StatusOr<std::vector<MatrixOutput>> Step(const StepOptions& step, absl::Span<const MatrixInput> inputs,
                                                 const ResultCallback& on_result = nullptr);

  // The summary of the last Step that completed on this client (for tools such as bench).
  std::optional<v1::StepSummary> last_summary() const;

  // The chunk size the next Step sends with.
  size_t chunk_bytes() const;

  const ClientOptions& options() const { return options_; }

 private:
  Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);
  void PrepareContext(grpc::ClientContext* context) const;
  absl::Status EnsureLimits();

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Orthogonalizer::Stub> stub_;
  std::shared_ptr<BufferPool> send_buffers_;  // Step's outgoing chunks.
  mutable absl::Mutex mu_;
  std::optional<v1::Limits> limits_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::StepSummary> last_summary_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve::client
