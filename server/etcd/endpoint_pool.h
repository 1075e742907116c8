// The channels to an etcd cluster's members and the failover rule every call follows: start
// at the endpoint that answered last, and on UNAVAILABLE (refused, reset, or not connected
// within the dial timeout) try the next one, all within the caller's deadline.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "server/etcd/etcd_options.h"

namespace orthoserve::etcd {

class EndpointPool {
 public:
  // One channel per endpoint (created lazily by gRPC: no connection is made here).
  // INVALID_ARGUMENT for bad options (ValidateEtcdOptions) or a TLS file that cannot be read.
  static absl::StatusOr<std::unique_ptr<EndpointPool>> Create(const EtcdOptions& options);

  // One attempt of a call on one channel; `context` carries the deadline already.
  using Attempt =
      std::function<grpc::Status(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context)>;

  // Whether a call may be sent again to another endpoint after it may have been applied.
  enum class Retry {
    kRepeatable,  // Reads, and writes that are idempotent by construction (leases, election).
    kMutation,    // Put, DeleteRange, Txn: a second application could change the answer.
  };

  // Runs `attempt` on the endpoints in failover order until one answers with anything but
  // UNAVAILABLE, or `deadline` passes. An endpoint that is not connected within the dial
  // timeout is always skipped. A kMutation call that reached an endpoint fails over only when
  // etcd says it was not applied (no raft leader, or gRPC found no connection); otherwise its
  // UNAVAILABLE is returned, saying the outcome is unknown (as etcd's Go client does), and the
  // next call starts at the next endpoint.
  // Returns the answer as an absl::Status (the gRPC code, the message prefixed with `what`);
  // UNAVAILABLE naming every endpoint when none answered; DEADLINE_EXCEEDED when the deadline
  // passed after some endpoint was reached. Thread-safe.
  absl::Status Call(absl::string_view what, Retry retry, absl::Time deadline, const Attempt& attempt);

  // A channel that is connected now, in failover order, for a stream. UNAVAILABLE naming every
  // endpoint when none connects within the dial timeout (and `deadline`). Thread-safe.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectedChannel(absl::Time deadline);

  const EtcdOptions& options() const { return options_; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  EndpointPool(EtcdOptions options, std::vector<std::string> endpoints,
               std::vector<std::shared_ptr<grpc::Channel>> channels)
      : options_(std::move(options)), endpoints_(std::move(endpoints)), channels_(std::move(channels)) {}

  // Waits until channel `index` is connected, at most the dial timeout and until `deadline`.
  bool WaitConnected(size_t index, absl::Time deadline) const;
  size_t Preferred() const;
  void Prefer(size_t index);

  const EtcdOptions options_;
  const std::vector<std::string> endpoints_;
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;  // Parallel to endpoints_.
  mutable absl::Mutex mu_;
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;  // The endpoint that answered last.
};

}  // namespace orthoserve::etcd
