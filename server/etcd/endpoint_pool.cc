// Implementation of server/etcd/endpoint_pool.h.
#include "server/etcd/endpoint_pool.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/convert/grpc_status.h"

namespace orthoserve::etcd {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("etcd ", what, ": cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const EtcdOptions& options) {
  if (options.tls_ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.tls_ca_file, "tls_ca_file"));
  if (!options.tls_cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFile(options.tls_cert_file, "tls_cert_file"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFile(options.tls_key_file, "tls_key_file"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<EndpointPool>> EndpointPool::Create(const EtcdOptions& options) {
  ASSIGN_OR_RETURN(std::vector<std::string> endpoints, ValidateEtcdOptions(options));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, Credentials(options));
  grpc::ChannelArguments args;
  // Reconnect quickly after a member restarts: gRPC's default backoff grows to two minutes.
  const int dial_ms = static_cast<int>(absl::ToInt64Milliseconds(options.dial_timeout));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(200, dial_ms / 2));
  // Notice a dead member under an open stream. etcd accepts pings every 5 s or more, and only
  // while a call is open (its default enforcement policy).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  channels.reserve(endpoints.size());
  for (const std::string& endpoint : endpoints) {
    channels.push_back(grpc::CreateCustomChannel(endpoint, credentials, args));
  }
  return std::unique_ptr<EndpointPool>(new EndpointPool(options, std::move(endpoints), std::move(channels)));
}

size_t EndpointPool::Preferred() const {
  absl::MutexLock lock(&mu_);
  return preferred_;
}

void EndpointPool::Prefer(size_t index) {
  absl::MutexLock lock(&mu_);
  preferred_ = index;
}

bool EndpointPool::WaitConnected(size_t index, absl::Time deadline) const {
  const absl::Time until = std::min(deadline, absl::Now() + options_.dial_timeout);
  return channels_[index]->WaitForConnected(absl::ToChronoTime(until));
}

namespace {

// Whether an UNAVAILABLE answer proves that the request was not applied: etcd refuses requests
// while its member has no raft leader (rpctypes.ErrGRPCNoLeader), and gRPC fails a call it
// could not send anywhere with this message. A reset connection or etcd's "request timed out"
// proves nothing.
bool NotApplied(const grpc::Status& status) {
  return absl::StrContains(status.error_message(), "etcdserver: no leader") ||
         absl::StrContains(status.error_message(), "failed to connect to all addresses");
}

}  // namespace

absl::Status EndpointPool::Call(absl::string_view what, Retry retry, absl::Time deadline, const Attempt& attempt) {
  const size_t first = Preferred();
  std::vector<std::string> failures;
  bool attempted = false;  // Whether any endpoint was connected and got the call.
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t index = (first + i) % endpoints_.size();
    if (absl::Now() >= deadline) break;
    if (!WaitConnected(index, deadline)) {
      failures.push_back(absl::StrCat(endpoints_[index], ": not connected within the dial timeout"));
      continue;
    }
    attempted = true;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    const grpc::Status status = attempt(channels_[index], context);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && retry == Retry::kMutation && !NotApplied(status)) {
      // Not sent on, but the next call starts at the next endpoint: this one just failed, and
      // gRPC may not have noticed its broken connection yet.
      Prefer((index + 1) % endpoints_.size());
      return absl::UnavailableError(absl::StrCat(what, " (", endpoints_[index], "): ", status.error_message(),
                                                 "; the write may or may not have been applied"));
    }
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      failures.push_back(absl::StrCat(endpoints_[index], ": ", status.error_message()));
      continue;
    }
    Prefer(index);
    return Annotate(FromGrpcStatus(status), absl::StrCat(what, " (", endpoints_[index], ")"));
  }
  // A cluster that never connected is UNAVAILABLE even when the deadline ran out meanwhile.
  if (attempted && absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": deadline passed after ", absl::StrJoin(failures, "; ")));
  }
  return absl::UnavailableError(absl::StrCat(what, ": no etcd endpoint answered: ", absl::StrJoin(failures, "; ")));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> EndpointPool::ConnectedChannel(absl::Time deadline) {
  const size_t first = Preferred();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t index = (first + i) % endpoints_.size();
    if (absl::Now() >= deadline) break;
    if (WaitConnected(index, deadline)) {
      Prefer(index);
      return channels_[index];
    }
  }
  return absl::UnavailableError(
      absl::StrCat("no etcd endpoint connected within the dial timeout: ", absl::StrJoin(endpoints_, ",")));
}

}  // namespace orthoserve::etcd
