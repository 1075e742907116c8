// Implementation of server/etcd/etcd_client.h: keys, transactions and leases. The election
// calls are in etcd_election.cc.
#include "server/etcd/etcd_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "server/etcd/kv_convert.h"

namespace orthoserve::etcd {

absl::Status MalformedAnswer(absl::string_view what, absl::string_view answered) {
  return absl::InternalError(absl::StrCat(what, ": etcd answered ", answered, ", which no etcd server sends"));
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<EndpointPool> pool, EndpointPool::Create(options));
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(pool)));
}

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(pool_->Call(absl::StrCat("etcd get ", key), EndpointPool::Retry::kRepeatable, CallDeadline(),
                              [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                                return etcdserverpb::KV::NewStub(channel)->Range(&context, request, &response);
                              }));
  if (response.kvs_size() == 0) return std::optional<KeyValue>();
  if (response.kvs_size() > 1 || response.kvs(0).key() != key) {
    return MalformedAnswer(absl::StrCat("etcd get ", key), "another key or more than one");
  }
  return std::optional<KeyValue>(FromProto(response.kvs(0)));
}

absl::StatusOr<RangeResult> EtcdClient::GetPrefix(const std::string& prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(pool_->Call(absl::StrCat("etcd get prefix ", prefix), EndpointPool::Retry::kRepeatable,
                              CallDeadline(),
                              [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                                return etcdserverpb::KV::NewStub(channel)->Range(&context, request, &response);
                              }));
  RangeResult result;
  result.revision = response.header().revision();
  result.kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) {
    if (!absl::StartsWith(kv.key(), prefix)) {
      return MalformedAnswer(absl::StrCat("etcd get prefix ", prefix), "a key outside the prefix");
    }
    result.kvs.push_back(FromProto(kv));
  }
  return result;
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  RETURN_IF_ERROR(pool_->Call(absl::StrCat("etcd put ", key), EndpointPool::Retry::kMutation, CallDeadline(),
                              [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                                return etcdserverpb::KV::NewStub(channel)->Put(&context, request, &response);
                              }));
  return response.header().revision();
}

namespace {

absl::StatusOr<int64_t> DeleteRange(EndpointPool& pool, absl::Time deadline, const std::string& what,
                                    etcdserverpb::DeleteRangeRequest request) {
  etcdserverpb::DeleteRangeResponse response;
  RETURN_IF_ERROR(pool.Call(what, EndpointPool::Retry::kMutation, deadline,
                            [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                              return etcdserverpb::KV::NewStub(channel)->DeleteRange(&context, request, &response);
                            }));
  return response.deleted();
}

}  // namespace

absl::StatusOr<int64_t> EtcdClient::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  return DeleteRange(*pool_, CallDeadline(), absl::StrCat("etcd delete ", key), std::move(request));
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(const std::string& prefix) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  return DeleteRange(*pool_, CallDeadline(), absl::StrCat("etcd delete prefix ", prefix), std::move(request));
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(pool_->Call("etcd txn", EndpointPool::Retry::kMutation, CallDeadline(),
                              [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                                return etcdserverpb::KV::NewStub(channel)->Txn(&context, request, &response);
                              }));
  return response;
}

absl::StatusOr<TxnResult> EtcdClient::GuardedPut(const std::string& key, const std::string& value, int64_t mod_revision,
                                                 int64_t lease) {
  // if mod_revision(key) == mod_revision then put else get: a missing key has mod revision 0.
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* compare = request.add_compare();
  compare->set_key(key);
  compare->set_target(etcdserverpb::Compare::MOD);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_mod_revision(mod_revision);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(key);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse response, Txn(request));
  TxnResult result;
  result.succeeded = response.succeeded();
  result.revision = response.header().revision();
  if (!result.succeeded && response.responses_size() == 1 && response.responses(0).response_range().kvs_size() > 0) {
    result.current = FromProto(response.responses(0).response_range().kvs(0));
  }
  return result;
}

absl::StatusOr<TxnResult> EtcdClient::CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease) {
  return GuardedPut(key, value, 0, lease);
}

absl::StatusOr<TxnResult> EtcdClient::PutIfModRevision(const std::string& key, const std::string& value,
                                                       int64_t mod_revision, int64_t lease) {
  return GuardedPut(key, value, mod_revision, lease);
}

absl::StatusOr<Lease> EtcdClient::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  RETURN_IF_ERROR(pool_->Call("etcd lease grant", EndpointPool::Retry::kRepeatable, CallDeadline(),
                              [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                                return etcdserverpb::Lease::NewStub(channel)->LeaseGrant(&context, request, &response);
                              }));
  if (!response.error().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd lease grant: ", response.error()));
  }
  if (response.id() == 0 || response.ttl() < 1) {
    return MalformedAnswer("etcd lease grant", absl::StrCat("lease ", response.id(), " with TTL ", response.ttl()));
  }
  return Lease{response.id(), response.ttl()};
}

absl::StatusOr<absl::Duration> EtcdClient::LeaseTimeToLive(int64_t lease_id) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseTimeToLiveResponse response;
  const std::string what = absl::StrCat("etcd lease time-to-live ", lease_id);
  RETURN_IF_ERROR(pool_->Call(what, EndpointPool::Retry::kRepeatable, CallDeadline(),
                              [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                                return etcdserverpb::Lease::NewStub(channel)->LeaseTimeToLive(&context, request,
                                                                                              &response);
                              }));
  // etcd 3.4 answers an unknown lease with TTL -1 (older releases with NOT_FOUND, passed on as is).
  if (response.ttl() < 0) return absl::NotFoundError(absl::StrCat(what, ": etcd holds no such lease"));
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::RevokeLease(int64_t lease_id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse response;
  return pool_->Call(absl::StrCat("etcd lease revoke ", lease_id), EndpointPool::Retry::kRepeatable, CallDeadline(),
                     [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context) {
                       return etcdserverpb::Lease::NewStub(channel)->LeaseRevoke(&context, request, &response);
                     });
}

}  // namespace orthoserve::etcd
