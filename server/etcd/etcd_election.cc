// Implementation of server/etcd/etcd_client.h: leader election over etcd's Election service.
//
// Why etcd's Election service rather than our own election over KV, Txn and Watch: etcd 3.4
// serves it on every member's client port (etcdserver/api/v3election, the concurrency
// package's algorithm run inside etcd: a key "<name>/<lease id in hex>" per candidate, the
// lowest create revision leads, each candidate waits for the deletion of the one before it).
// It keeps no state of its own between calls (each call resumes from the LeaderKey), so
// failing a call over to another member is safe. Plain Go errors of that package reach us as
// UNKNOWN with etcd's message; the three we rely on are mapped to proper codes here.
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "etcd/v3electionpb/v3election.grpc.pb.h"
#include "server/etcd/etcd_client.h"
#include "server/etcd/kv_convert.h"

namespace orthoserve::etcd {
namespace {

// etcd's concurrency.ErrElectionNoLeader and ErrElectionNotLeader, as their messages.
constexpr char kNoLeader[] = "election: no leader";
constexpr char kNotLeader[] = "election: not leader";
// rpctypes.ErrLeaseNotFound, which the election service passes on as a plain error.
constexpr char kLeaseNotFound[] = "requested lease not found";

absl::Status MapElectionError(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnknown) return status;
  if (absl::StrContains(status.message(), kNoLeader)) return absl::NotFoundError(status.message());
  if (absl::StrContains(status.message(), kLeaseNotFound)) {
    return absl::NotFoundError(status.message());
  }
  if (absl::StrContains(status.message(), kNotLeader)) {
    return absl::FailedPreconditionError(status.message());
  }
  return status;
}

// Whether `key` is a candidate's key of election `name` ("<name>/<lease id in hex>").
bool InElection(const std::string& name, const std::string& key) {
  return key.size() > name.size() + 1 && absl::StartsWith(key, name) && key[name.size()] == '/';
}

v3electionpb::LeaderKey ToProto(const LeaderKey& leader) {
  v3electionpb::LeaderKey out;
  out.set_name(leader.name);
  out.set_key(leader.key);
  out.set_rev(leader.revision);
  out.set_lease(leader.lease);
  return out;
}

}  // namespace

absl::StatusOr<LeaderKey> EtcdClient::Campaign(const std::string& name, int64_t lease, const std::string& value,
                                               absl::Time deadline) {
  v3electionpb::CampaignRequest request;
  request.set_name(name);
  request.set_lease(lease);
  request.set_value(value);
  v3electionpb::CampaignResponse response;
  RETURN_IF_ERROR(MapElectionError(
      pool_->Call(absl::StrCat("etcd campaign ", name), EndpointPool::Retry::kRepeatable, deadline,
                  [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                    return v3electionpb::Election::NewStub(channel)->Campaign(&context, request, &response);
                  })));
  LeaderKey leader;
  leader.name = response.leader().name();
  leader.key = response.leader().key();
  leader.revision = response.leader().rev();
  leader.lease = response.leader().lease();
  if (!InElection(name, leader.key) || leader.revision <= 0) {
    return MalformedAnswer(absl::StrCat("etcd campaign ", name),
                           absl::StrCat("a leader key outside the election, or of revision ", leader.revision));
  }
  return leader;
}

absl::StatusOr<KeyValue> EtcdClient::Leader(const std::string& name) {
  v3electionpb::LeaderRequest request;
  request.set_name(name);
  v3electionpb::LeaderResponse response;
  RETURN_IF_ERROR(MapElectionError(
      pool_->Call(absl::StrCat("etcd leader ", name), EndpointPool::Retry::kRepeatable, CallDeadline(),
                  [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                    return v3electionpb::Election::NewStub(channel)->Leader(&context, request, &response);
                  })));
  if (!response.has_kv()) return absl::NotFoundError(absl::StrCat("etcd leader ", name, ": none"));
  if (!InElection(name, response.kv().key()) || response.kv().create_revision() <= 0) {
    return MalformedAnswer(absl::StrCat("etcd leader ", name),
                           absl::StrCat("a key outside the election, or of revision ", response.kv().create_revision()));
  }
  return FromProto(response.kv());
}

absl::Status EtcdClient::Proclaim(const LeaderKey& leader, const std::string& value) {
  v3electionpb::ProclaimRequest request;
  *request.mutable_leader() = ToProto(leader);
  request.set_value(value);
  v3electionpb::ProclaimResponse response;
  return MapElectionError(
      pool_->Call(absl::StrCat("etcd proclaim ", leader.name), EndpointPool::Retry::kRepeatable, CallDeadline(),
                  [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                    return v3electionpb::Election::NewStub(channel)->Proclaim(&context, request, &response);
                  }));
}

absl::Status EtcdClient::Resign(const LeaderKey& leader) {
  v3electionpb::ResignRequest request;
  *request.mutable_leader() = ToProto(leader);
  v3electionpb::ResignResponse response;
  return MapElectionError(
      pool_->Call(absl::StrCat("etcd resign ", leader.name), EndpointPool::Retry::kRepeatable, CallDeadline(),
                  [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                    return v3electionpb::Election::NewStub(channel)->Resign(&context, request, &response);
                  }));
}

}  // namespace orthoserve::etcd
