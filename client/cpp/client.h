// orthoserve C++ client: a channel to each of one or more server addresses, with the unary,
// streaming, info and health calls of orthoserve.v1.Orthogonalizer
// (proto/orthoserve/v1/orthogonalizer.proto), which retry retryable failures and fail over between
// the addresses (client/cpp/retry.h).
//
//   ASSIGN_OR_RETURN(auto client, Client::Create({.address = "127.0.0.1:50051"}));
//   ASSIGN_OR_RETURN(std::vector<MatrixOutput> out, client->Step(StepOptions{}, inputs));
#pragma once

#include <atomic>
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
#include "client/cpp/region.h"
#include "client/cpp/retry.h"
#include "common/buffer_pool.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"

namespace orthoserve::client {

struct ClientOptions {
  std::string address = "127.0.0.1:50051";  // Server HOST:PORT (any gRPC target string) when `addresses` is empty.
  // Server addresses in order of preference; when not empty, used instead of `address`. Lone calls
  // fail over between them (see Retries).
  std::vector<std::string> addresses;
  // Deadline of each attempt; InfiniteDuration for none. 90 s: longer than the service's default
  // 60 s rendezvous timeout (a step whose other ranks never come ends with the server's ABORTED
  // naming them), shorter than the 120 s retry deadline (a stalled server leaves time for a retry).
  absl::Duration timeout = absl::Seconds(90);
  // HTTP/2 keepalive of every channel: a ping after `keepalive_time` without one while calls are in
  // flight (never on an idle channel); the connection is dropped, failing its calls with
  // UNAVAILABLE (retried), when a ping is unanswered for `keepalive_timeout`: a server rank that
  // stopped is noticed within 15 s, about the fleet's peer timeout. orthoserve servers accept
  // pings every second (--grpc-min-client-ping-interval); a server with gRPC's default enforcement
  // (one in 5 min) would close the connection with GOAWAY "too_many_pings" (retried): use 5 min
  // for such servers. InfiniteDuration keepalive_time: no keepalive pings.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(5);
  int max_send_message_bytes = 256 << 20;     // Channel limit on one outgoing message; -1: none.
  int max_receive_message_bytes = 256 << 20;  // Channel limit on one incoming message; -1: none.
  size_t chunk_bytes = 0;                     // DataChunk size; 0: 4 MiB. Lowered to the server's limit.
  bool discover_limits = true;                // Ask GetServerInfo for the chunk limit before the first Step.
  std::string tls_ca_file;                    // PEM roots; non-empty (or a cert) selects TLS.
  std::string tls_cert_file;                  // PEM client certificate for mutual TLS (with key).
  std::string tls_key_file;                   // PEM client private key for mutual TLS (with cert).
  std::string tls_server_name;                // Overrides the name checked in the server cert.
  std::string bearer_token;                   // Sent as "authorization: Bearer <token>" when set.
  RetryOptions retry;                         // Retries of Step, Orthogonalize and GetServerInfo.
  // How long an attempt that named shared-memory slices and failed waits, at most, for the server
  // to let go of them (SharedMemory.FenceCall, retried while the server is unreachable) before it
  // is reported as FAILED_PRECONDITION: its slices may still be written (see "Fences" below).
  absl::Duration fence_timeout = absl::Seconds(120);
};

// The addresses a client made with `options` connects to: `addresses`, or `address` when that is
// empty.
std::vector<std::string> ClientAddresses(const ClientOptions& options);

// Called on the caller's thread as each matrix's result is complete, before Step returns.
using ResultCallback = std::function<void(const MatrixOutput&)>;

// Retries. Step, Orthogonalize and GetServerInfo retry retryable failures (UNAVAILABLE; ABORTED
// with `orthoserve-retryable: fleet-change` trailing metadata; CANCELLED) and attempts that ran
// out of their own `timeout` (DEADLINE_EXCEEDED; RetryLoop) under `ClientOptions::retry`: each
// attempt is bounded by `timeout`, all of them together by `retry.deadline`, with jittered
// exponential backoff between them; each retry is logged (LOG_WARNING "client") and counted
// (retries()). Every other code is final. A call that gives up after more than one attempt returns
// the last failure's code with "after N attempts: " in front of its message. Health never retries.
//
// Fail-over. A call's first attempt goes to the address that answered last (the first address at
// the start), and each retry to the next address in the list (cycling), so with two or more
// addresses a retry never goes where the attempt before it failed. Health, GetServerInfoOnce and
// StepOnce use the address that answered last and do not fail over.
//
// Shared-memory regions (region.h, CreateRegion). A call whose inputs name region slices
// (MatrixInput::input_region, result_region) is pinned to the address of their region: every
// attempt (and StepOnce) goes there, never to another address, and does not change address();
// when it fails with a code that would otherwise have failed over, its message says so. All the
// regions one call names must be on one address, one of this client's (INVALID_ARGUMENT
// otherwise, before anything is sent).
//
// Fences. A region slice belongs to the call that names it until the call has ended for the
// server too (docs/shared_memory.md, "Fences"): each attempt that names slices carries a fresh call
// id, and when it fails (any error, its deadline included) the client fences it
// (SharedMemory.FenceCall) before it retries or returns: the attempt's error comes back only once
// the server will never again read or write its slices, so the caller may reuse them at once. This
// can take as long as the matrix the server was computing for it. When the fence cannot be made
// within `fence_timeout` (the server unreachable, or a server without FenceCall), the call fails
// with FAILED_PRECONDITION saying its slices may still be written (never retried): do not reuse
// those slices (use a new region, or wait and call again).
//
// Thread-safe: any number of calls may run at once on one Client.
class Client {
 public:
  // Builds the channel (it connects lazily; no RPC is made). INVALID_ARGUMENT for bad options
  // (empty address, cert without key, non-positive timeout, bad retry options); NOT_FOUND/
  // PERMISSION_DENIED when a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);

  // Creates a client over an existing channel (in-process servers, tests), named by the first of
  // ClientAddresses(options). No TLS or token handling beyond `options.bearer_token` and the
  // per-call timeout; the options are not checked.
  static std::unique_ptr<Client> CreateWithChannel(std::shared_ptr<grpc::Channel> channel,
                                                   const ClientOptions& options);

  // The server's description, fleet membership and limits, with retries. Remembers the limits for
  // Step. The RPC's status on failure.
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // One GetServerInfo attempt to address() bounded by `timeout`, without retries (GroupClient
  // re-reading the membership). Failures carry the fleet-change mark (IsRetryable) when the server set it.
  absl::StatusOr<v1::ServerInfo> GetServerInfoOnce(absl::Duration timeout);

  // grpc.health.v1.Health/Check for the overall server (service "") at address(). OK when SERVING;
  // UNAVAILABLE naming the state (NOT_SERVING, UNKNOWN, ...) otherwise; the RPC's status when the
  // call fails (UNIMPLEMENTED when the server has no health service).
  absl::Status Health();

  // Unary Orthogonalize of whole matrices. Returns one output per input, in order, with its
  // per-matrix status; the call's status (INVALID_ARGUMENT for a bad input, checked before
  // sending; the server's code and message otherwise) when it fails as a whole.
  absl::StatusOr<std::vector<MatrixOutput>> Orthogonalize(absl::Span<const MatrixInput> inputs);

  // One OrthogonalizeStream step. Sends the header, each spec and its chunked data from gRPC's
  // callback threads while reading results on this one; results may arrive before every matrix is
  // sent, and on_result runs on this thread.
  // Returns one output per input, in input order, each with its per-matrix status; `on_result`
  // (optional) sees each as it completes, each matrix index once even when the step is retried
  // (results are deterministic; a retry's repeats are not passed again). Stream-level failures
  // return the stream's gRPC status (code and server message) once retries are over; INTERNAL
  // when the server breaks the protocol; INVALID_ARGUMENT for a bad input (nothing is sent).
  // Attempt k sends `StepHeader.attempt` = k.
  absl::StatusOr<std::vector<MatrixOutput>> Step(const StepOptions& step, absl::Span<const MatrixInput> inputs,
                                                 const ResultCallback& on_result = nullptr);

  // One attempt of Step to address(), without retries, for callers that run their own retry loop
  // (GroupClient):
  // sends `attempt` in the header and bounds the call (and the limits lookup before a first step)
  // by `timeout`. `delivered` (may be null; else inputs.size() entries) carries on_result's
  // once-per-index promise across attempts: indices already true are not passed to on_result,
  // and the ones passed are set. Returns what Step returns; failures carry the fleet-change mark
  // (IsRetryable) when the server set it.
  absl::StatusOr<std::vector<MatrixOutput>> StepOnce(const StepOptions& step, int attempt, absl::Duration timeout,
                                                     absl::Span<const MatrixInput> inputs,
                                                     const ResultCallback& on_result, std::vector<bool>* delivered);

  // A shared-memory region of `size` bytes registered on `options.address` (default: address())
  // for this client's tenant (its bearer token), handed over on the server's Unix socket
  // (`options.socket_path`, default the server's ServerInfo.shm_socket, read with one
  // GetServerInfo attempt). The client must run on the server's host. Errors:
  // INVALID_ARGUMENT for size <= 0 or an address that is not one of the client's;
  // FAILED_PRECONDITION when the server reports no shm_socket (it was started without
  // --shm-socket: regions are off); GetServerInfo's status when it fails; Region::Create's
  // errors otherwise. The region keeps a reference to the channel, not to the client.
  absl::StatusOr<std::unique_ptr<Region>> CreateRegion(int64_t size, const RegionOptions& options = {});

  // The summary of the last Step that completed on this client (for tools such as bench).
  std::optional<v1::StepSummary> last_summary() const;

  // The chunk size the next Step sends with (to the address that answered last).
  size_t chunk_bytes() const;

  // Retries made by this client's calls so far (each retry of Step, Orthogonalize, GetServerInfo).
  int64_t retries() const { return retries_.load(std::memory_order_relaxed); }

  const ClientOptions& options() const { return options_; }

  // The address that answered last (where the next call starts; the first address at the start).
  const std::string& address() const;
  // Every address, in the order given (ClientAddresses).
  std::vector<std::string> addresses() const;

 private:
  // One server address and its connection.
  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Orthogonalizer::Stub> stub;
  };
  // A retried call's attempts: the target of each and the retry loop.
  class Attempts;

  Client(std::vector<Target> targets, const ClientOptions& options);
  // Sets the deadline (now + `timeout`, none when infinite) and the bearer token.
  void PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const;
  // The index of the target that answered last.
  size_t preferred() const { return preferred_.load(std::memory_order_relaxed); }
  // Every attempt starts with this: a channel whose last connection attempt failed (TRANSIENT_FAILURE)
  // would fail the call at once with that old error until gRPC's reconnect backoff ends, though the
  // server may be back by now (a restarted rank); it dials again instead.
  void Redial(size_t target) const;
  // The index of `address` among the targets; nullopt when it is not one.
  std::optional<size_t> TargetOf(const std::string& address) const;
  // The target every attempt of a call with `inputs` must go to: that of the regions they name
  // (nullopt when they name none). INVALID_ARGUMENT when they name regions of two addresses, or of
  // an address that is not one of this client's.
  absl::StatusOr<std::optional<size_t>> RegionTarget(absl::Span<const MatrixInput> inputs) const;
  absl::StatusOr<v1::ServerInfo> InfoAttempt(size_t target, absl::Duration timeout);
  absl::Status EnsureLimits(size_t target, absl::Duration timeout);
  size_t ChunkBytesFor(size_t target) const;
  // StepOnce after the inputs were checked, at `target`.
  absl::StatusOr<std::vector<MatrixOutput>> StepAttempt(size_t target, const StepOptions& step, int attempt,
                                                        absl::Duration timeout, absl::Span<const MatrixInput> inputs,
                                                        const ResultCallback& on_result, std::vector<bool>* delivered);
  absl::StatusOr<std::vector<MatrixOutput>> OrthogonalizeAttempt(size_t target, const v1::OrthogonalizeRequest& request,
                                                                 absl::Span<const MatrixInput> inputs,
                                                                 absl::Duration timeout);
  absl::StatusOr<std::vector<MatrixOutput>> StreamAttempt(size_t target, const StepOptions& step, int attempt,
                                                          absl::Duration timeout, absl::Span<const MatrixInput> inputs,
                                                          const ResultCallback& on_result, std::vector<bool>* delivered,
                                                          const std::string& call_id);
  // `failed` (not OK), the outcome of the attempt at `target` whose call id `call_id` named region
  // slices, once the server holds none of them (FenceCall, retried while UNAVAILABLE or
  // DEADLINE_EXCEEDED, for up to fence_timeout); FAILED_PRECONDITION naming both failures when the
  // fence cannot be made.
  absl::Status Fenced(size_t target, const std::string& call_id, const absl::Status& failed);

  const ClientOptions options_;
  const std::shared_ptr<RetryEnvironment> retry_environment_;
  mutable std::atomic<int64_t> retries_{0};
  const std::vector<Target> targets_;  // Never empty.
  std::atomic<size_t> preferred_{0};   // Index into targets_ of the one that answered last.
  std::shared_ptr<BufferPool> send_buffers_;  // Step's outgoing chunks.
  mutable absl::Mutex mu_;
  std::vector<std::optional<v1::Limits>> limits_ ABSL_GUARDED_BY(mu_);  // Per target, once asked.
  std::optional<v1::StepSummary> last_summary_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve::client
