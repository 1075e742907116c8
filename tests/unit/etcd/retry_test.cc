// The failover rule for writes: a member that answers UNAVAILABLE after it may have applied a
// write ("request timed out") ends the call with UNAVAILABLE, where a read goes on to the next
// member; a member with no raft leader ("no leader") has applied nothing, so writes fail over
// too. The failing member is an in-process fake of etcd's KV service, the next one a real etcd.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

// Answers every KV call with UNAVAILABLE and `message`, counting the calls.
class FailingKv final : public etcdserverpb::KV::Service {
 public:
  explicit FailingKv(std::string message) : message_(std::move(message)) {}

  grpc::Status Range(grpc::ServerContext*, const etcdserverpb::RangeRequest*, etcdserverpb::RangeResponse*) override {
    return Fail();
  }
  grpc::Status Put(grpc::ServerContext*, const etcdserverpb::PutRequest*, etcdserverpb::PutResponse*) override {
    return Fail();
  }
  grpc::Status Txn(grpc::ServerContext*, const etcdserverpb::TxnRequest*, etcdserverpb::TxnResponse*) override {
    return Fail();
  }

  int calls() const { return calls_.load(); }

 private:
  grpc::Status Fail() {
    ++calls_;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, message_);
  }

  const std::string message_;
  std::atomic<int> calls_{0};
};

// A fake member on 127.0.0.1:<free port>.
struct FakeMember {
  explicit FakeMember(const std::string& message) : service(message) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeMember() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5)); }

  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port); }

  FailingKv service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

class EtcdRetryTest : public EtcdTest {
 protected:
  // A client whose first endpoint is `fake` and whose second is the real etcd.
  std::unique_ptr<etcd::EtcdClient> ClientVia(const FakeMember& fake) {
    etcd::EtcdOptions options;
    options.endpoints = absl::StrCat(fake.endpoint(), ",", cluster_->endpoints());
    options.dial_timeout = absl::Seconds(1);
    options.call_timeout = absl::Seconds(3);
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }
};

TEST_F(EtcdRetryTest, AWriteThatMayHaveBeenAppliedIsNotSentAgain) {
  FakeMember fake("etcdserver: request timed out");
  ASSERT_NE(fake.server, nullptr);
  const auto kUnknownOutcome = StatusIs(absl::StatusCode::kUnavailable, HasSubstr("may or may not have been applied"));
  std::unique_ptr<etcd::EtcdClient> client = ClientVia(fake);
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->Put("/k", "v"), kUnknownOutcome);
  EXPECT_EQ(fake.service.calls(), 1);
  EXPECT_THAT(client_->Get("/k"), IsOkAndHolds(::testing::Eq(std::nullopt)));  // Not sent on.
  // The next call starts at the next endpoint.
  EXPECT_OK(client->Put("/k", "v"));
  EXPECT_EQ(fake.service.calls(), 1);

  std::unique_ptr<etcd::EtcdClient> cas = ClientVia(fake);
  ASSERT_NE(cas, nullptr);
  EXPECT_THAT(cas->CreateIfAbsent("/c", "v"), kUnknownOutcome);
  EXPECT_EQ(fake.service.calls(), 2);
  EXPECT_THAT(client_->Get("/c"), IsOkAndHolds(::testing::Eq(std::nullopt)));

  // A read fails over to the real member at once.
  std::unique_ptr<etcd::EtcdClient> reader = ClientVia(fake);
  ASSERT_NE(reader, nullptr);
  EXPECT_THAT(reader->Get("/k"), IsOkAndHolds(::testing::Optional(::testing::Field(&etcd::KeyValue::value, "v"))));
  EXPECT_EQ(fake.service.calls(), 3);
}

TEST_F(EtcdRetryTest, AWriteRefusedForWantOfALeaderFailsOver) {
  FakeMember fake("etcdserver: no leader");
  ASSERT_NE(fake.server, nullptr);
  std::unique_ptr<etcd::EtcdClient> client = ClientVia(fake);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<etcd::TxnResult> created = client->CreateIfAbsent("/k", "v");
  ASSERT_OK(created);
  EXPECT_TRUE(created->succeeded);
  EXPECT_EQ(fake.service.calls(), 1);
}

}  // namespace
}  // namespace orthoserve::testing
