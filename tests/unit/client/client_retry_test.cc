// Client and GroupClient retries over loopback gRPC against fake servers that fail on purpose
// (tests/unit/client/fake_server.h): which codes are retried, the attempt numbers sent, the
// deadline, results delivered once, and a group step re-routed after its member failed.
#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "client/cpp/orthoctl/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/fake_retry_environment.h"
#include "tests/unit/client/fake_server.h"
#include "tests/unit/client/input_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::client::testing::FakeRetryEnvironment;
using ::orthoserve::client::testing::FakeServer;
using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::F32Input;

std::vector<int> Attempts(FakeServer& server) {
  absl::MutexLock lock(&server.service->mu);
  return server.service->attempts;
}

class ClientRetryTest : public ::testing::Test {
 protected:
  void SetUp() override { server_.Start(); }

  // A client of server_ whose retries wait on a fake clock (no real sleeps).
  std::unique_ptr<Client> Connect(RetryOptions retry = {}) {
    ClientOptions options;
    options.address = server_.address;
    options.timeout = absl::Seconds(20);
    retry.environment = env_;
    options.retry = retry;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_OK(client);
    return *std::move(client);
  }

  FakeServer server_;
  std::shared_ptr<FakeRetryEnvironment> env_ = std::make_shared<FakeRetryEnvironment>();
  const std::vector<float> data_ = std::vector<float>(16, 1.5f);
  MatrixInput input_ = F32Input("w", {4, 4}, data_);
};

TEST_F(ClientRetryTest, UnavailableIsRetriedWithTheAttemptInTheHeader) {
  server_.service->fail_streams = 2;
  auto client = Connect();
  ::testing::internal::CaptureStderr();
  auto out = client->Step(StepOptions{}, {&input_, 1});
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(out);
  EXPECT_OK((*out)[0].status);
  EXPECT_THAT(Attempts(server_), ElementsAre(0, 1, 2));
  EXPECT_EQ(client->retries(), 2);
  EXPECT_EQ(env_->sleeps().size(), 2u);
  EXPECT_THAT(log, HasSubstr("attempt 0 failed with UNAVAILABLE: injected failure; retrying as attempt 1 in 100ms"));
  EXPECT_THAT(log, HasSubstr("attempt 1 failed with UNAVAILABLE: injected failure; retrying as attempt 2 in 200ms"));
}

TEST_F(ClientRetryTest, AbortedByAFleetChangeIsRetried) {
  server_.service->fail_streams = 1;
  server_.service->fail_code = grpc::StatusCode::ABORTED;
  server_.service->fail_fleet_change = true;
  auto client = Connect();
  ASSERT_OK(client->Step(StepOptions{"job", "g", 4, 0, 1, ""}, {&input_, 1}));
  EXPECT_THAT(Attempts(server_), ElementsAre(0, 1));
  EXPECT_EQ(client->retries(), 1);
}

TEST_F(ClientRetryTest, PlainAbortedIsFinal) {
  server_.service->fail_streams = 1;
  server_.service->fail_code = grpc::StatusCode::ABORTED;
  auto client = Connect();
  EXPECT_THAT(client->Step(StepOptions{}, {&input_, 1}), StatusIs(absl::StatusCode::kAborted, "injected failure"));
  EXPECT_THAT(Attempts(server_), ElementsAre(0));
  EXPECT_EQ(client->retries(), 0);
}

TEST_F(ClientRetryTest, InvalidArgumentIsFinalEvenWithTheMetadata) {
  server_.service->fail_streams = 1;
  server_.service->fail_code = grpc::StatusCode::INVALID_ARGUMENT;
  server_.service->fail_fleet_change = true;
  auto client = Connect();
  EXPECT_THAT(client->Step(StepOptions{}, {&input_, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "injected failure"));
  EXPECT_THAT(Attempts(server_), ElementsAre(0));
}

TEST_F(ClientRetryTest, DisabledRetriesMakeOneAttempt) {
  server_.service->fail_streams = 1;
  RetryOptions off;
  off.enabled = false;
  auto client = Connect(off);
  EXPECT_THAT(client->Step(StepOptions{}, {&input_, 1}), StatusIs(absl::StatusCode::kUnavailable, "injected failure"));
  EXPECT_THAT(Attempts(server_), ElementsAre(0));
  EXPECT_EQ(client->retries(), 0);
  EXPECT_TRUE(env_->sleeps().empty());
}

TEST_F(ClientRetryTest, GivesUpAtTheDeadlineWithTheLastCode) {
  server_.service->fail_streams = 1000;
  RetryOptions retry;
  retry.deadline = absl::Seconds(1);
  auto client = Connect(retry);
  // Waits of 0.1, 0.2 and 0.4 s fit in the deadline; 0.8 s more would not.
  EXPECT_THAT(
      client->Step(StepOptions{}, {&input_, 1}),
      StatusIs(absl::StatusCode::kUnavailable, "after 4 attempts (retry deadline of 1s reached): injected failure"));
  EXPECT_THAT(Attempts(server_), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(client->retries(), 3);
}

TEST_F(ClientRetryTest, GivesUpAtTheDeadlineOnTheRealClock) {
  server_.service->fail_streams = 1000;
  ClientOptions options;
  options.address = server_.address;
  options.retry.deadline = absl::Milliseconds(300);
  options.retry.initial_backoff = absl::Milliseconds(5);
  options.retry.max_backoff = absl::Milliseconds(20);
  auto client = Client::Create(options);
  ASSERT_OK(client);
  const absl::Time start = absl::Now();
  EXPECT_THAT((*client)->Step(StepOptions{}, {&input_, 1}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("(retry deadline of 300ms reached): injected")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_GE(Attempts(server_).size(), 2u);
}

TEST_F(ClientRetryTest, MaxAttempts) {
  server_.service->fail_streams = 1000;
  RetryOptions retry;
  retry.max_attempts = 3;
  auto client = Connect(retry);
  EXPECT_THAT(client->Step(StepOptions{}, {&input_, 1}),
              StatusIs(absl::StatusCode::kUnavailable, "after 3 attempts (max_attempts 3 reached): injected failure"));
  EXPECT_THAT(Attempts(server_), ElementsAre(0, 1, 2));
}

TEST_F(ClientRetryTest, OnResultSeesEachIndexOnceAcrossAttempts) {
  server_.service->fail_streams = 2;
  server_.service->fail_after_results = true;  // Every result is sent, then the stream fails.
  auto client = Connect();
  const std::vector<float> a(24, 1.0f), b(6, 2.0f), c(8, 3.0f);
  std::vector<MatrixInput> inputs = {F32Input("a", {4, 6}, a), F32Input("b", {2, 3}, b), F32Input("c", {2, 4}, c)};
  std::vector<int> seen;
  auto out = client->Step(StepOptions{}, inputs, [&](const MatrixOutput& o) { seen.push_back(o.index); });
  ASSERT_OK(out);
  EXPECT_THAT(seen, ElementsAre(0, 1, 2));
  EXPECT_THAT(Attempts(server_), ElementsAre(0, 1, 2));
  ASSERT_EQ(out->size(), 3u);
  for (const MatrixOutput& o : *out) EXPECT_EQ(o.data.size(), o.block.numel() * sizeof(float)) << o.name;
}

TEST_F(ClientRetryTest, OrthogonalizeAndGetServerInfoRetry) {
  server_.service->fail_unary = 2;
  server_.service->fail_info = 1;
  auto client = Connect();
  ASSERT_OK(client->GetServerInfo());
  EXPECT_EQ(server_.service->info_calls.load(), 2);
  auto out = client->Orthogonalize({&input_, 1});
  ASSERT_OK(out);
  EXPECT_OK((*out)[0].status);
  EXPECT_EQ(server_.service->unary_calls.load(), 3);
  EXPECT_EQ(client->retries(), 3);

  server_.service->fail_unary = 1;
  server_.service->fail_code = grpc::StatusCode::RESOURCE_EXHAUSTED;
  EXPECT_THAT(client->Orthogonalize({&input_, 1}), StatusIs(absl::StatusCode::kResourceExhausted, "injected failure"));
  EXPECT_EQ(client->retries(), 3);
}

TEST_F(ClientRetryTest, LimitsLookupFailuresAreRetriedWithTheStep) {
  server_.service->fail_info = 1;  // The GetServerInfo before the first step.
  auto client = Connect();
  ASSERT_OK(client->Step(StepOptions{}, {&input_, 1}));
  EXPECT_EQ(server_.service->info_calls.load(), 2);
  EXPECT_THAT(Attempts(server_), ElementsAre(1));  // The first attempt never reached the stream.
}

TEST_F(ClientRetryTest, OrthoctlRetriesUnlessTold) {
  using orthoctl::kExitOk;
  using orthoctl::kExitRpc;
  server_.service->fail_info = 1;
  std::ostringstream out, err;
  EXPECT_EQ(orthoctl::RunInfo({"--server", server_.address}, out, err), kExitOk) << err.str();
  EXPECT_EQ(server_.service->info_calls.load(), 2);
  server_.service->fail_info = 1;
  std::ostringstream no_out, no_err;
  EXPECT_EQ(orthoctl::RunInfo({"--server", server_.address, "--no-retry"}, no_out, no_err), kExitRpc);
  EXPECT_THAT(no_err.str(), HasSubstr("UNAVAILABLE"));
  server_.service->fail_streams = 1000;
  std::ostringstream bench_out, bench_err;
  EXPECT_EQ(orthoctl::RunBench({"--server", server_.address, "--shape", "4,4", "--iters", "1", "--warmup", "0",
                                "--retry-deadline", "0.3"},
                               bench_out, bench_err),
            kExitRpc);
  EXPECT_THAT(bench_err.str(), HasSubstr("(retry deadline of 300ms reached): injected failure"));
}

TEST(ClientRetryOptions, CreateRejectsBadRetryOptions) {
  ClientOptions o;
  o.retry.multiplier = 0;
  EXPECT_THAT(Client::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiplier")));
  GroupClient::Options g;
  g.membership_timeout = absl::ZeroDuration();
  v1::ServerInfo info;
  info.set_fleet_world(1);
  EXPECT_THAT(GroupClient::CreateFromInfo(g, info, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("membership_timeout")));
}

// Two fake fleet members; trainer rank 0 of 2 starts on member 0, rank 1 on member 1.
class GroupRetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s0_.Start();
    s1_.Start();
    for (FakeServer* s : {&s0_, &s1_}) s->service->members = {s0_.address, s1_.address};
    s1_.service->fleet_rank = 1;
  }

  std::unique_ptr<GroupClient> Group() {
    GroupClient::Options options;
    options.client.address = s0_.address;
    options.client.timeout = absl::Seconds(20);
    options.client.retry.environment = env_;
    auto group = GroupClient::Create(options);
    EXPECT_OK(group);
    return *std::move(group);
  }

  // Member 0 leaves the current generation: both servers now list it as not ready.
  void Member0Leaves() {
    for (FakeServer* s : {&s0_, &s1_}) {
      absl::MutexLock lock(&s->service->mu);
      s->service->member_ready = {false, true};
      s->service->fleet_generation = 2;
    }
  }

  FakeServer s0_, s1_;
  std::shared_ptr<FakeRetryEnvironment> env_ = std::make_shared<FakeRetryEnvironment>();
};

TEST_F(GroupRetryTest, ReRoutesToAReadyMemberAfterItsMemberFails) {
  auto group = Group();
  EXPECT_EQ(group->FleetRankFor(0, 2), 0);
  EXPECT_EQ(group->fleet_generation(), 1);
  s0_.service->fail_streams = 1;
  s0_.service->fail_after_results = true;  // Results arrive from member 0 before the failure.
  Member0Leaves();
  const std::vector<float> a(32, 1.0f);
  std::vector<MatrixInput> inputs = {F32Input("w", {8, 4}, a), F32Input("v", {4, 8}, a)};
  inputs[0].block = Block{0, 0, 4, 4};
  inputs[0].bytes = 16 * sizeof(float);
  inputs[1].block = Block{0, 0, 2, 8};
  inputs[1].bytes = 16 * sizeof(float);
  std::vector<int> seen;
  auto out = group->Step("job", "fsdp", 9, 0, 2, inputs, [&](const MatrixOutput& o) { seen.push_back(o.index); });
  ASSERT_OK(out);
  EXPECT_THAT(seen, ElementsAre(0, 1));
  EXPECT_THAT(Attempts(s0_), ElementsAre(0));
  EXPECT_THAT(Attempts(s1_), ElementsAre(1));  // The same step, attempt 1, on the ready member.
  {
    absl::MutexLock lock(&s1_.service->mu);
    EXPECT_EQ(s1_.service->last_header.job(), "job");
    EXPECT_EQ(s1_.service->last_header.step(), 9);
    EXPECT_EQ(s1_.service->last_header.rank(), 0);
    EXPECT_EQ(s1_.service->last_header.world(), 2);
  }
  EXPECT_EQ(group->retries(), 1);
  EXPECT_EQ(group->fleet_generation(), 2);
  EXPECT_FALSE(group->member_ready(0));
  EXPECT_TRUE(group->member_ready(1));
  EXPECT_EQ(group->FleetRankFor(0, 2), 1);  // One ready member serves both trainer ranks.
  EXPECT_EQ(group->FleetRankFor(1, 2), 1);
}

TEST_F(GroupRetryTest, AsksTheOtherMembersWhenTheFailedOneCannotAnswer) {
  auto group = Group();
  s0_.service->fail_streams = 1;
  s0_.service->fail_info = 1;  // Member 0 cannot describe the fleet either.
  Member0Leaves();
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  ASSERT_OK(group->Step("job", "g", 1, 0, 1, {&in, 1}));
  EXPECT_THAT(Attempts(s0_), ElementsAre(0));
  EXPECT_THAT(Attempts(s1_), ElementsAre(1));
  EXPECT_EQ(group->fleet_generation(), 2);
}

TEST_F(GroupRetryTest, FinalFailuresAreNotRetriedOrReRouted) {
  auto group = Group();
  const int info_calls = s0_.service->info_calls.load();
  s0_.service->fail_streams = 1;
  s0_.service->fail_code = grpc::StatusCode::ABORTED;  // A rendezvous timeout, say.
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  EXPECT_THAT(group->Step("job", "g", 1, 0, 2, {&in, 1}), StatusIs(absl::StatusCode::kAborted, "injected failure"));
  EXPECT_THAT(Attempts(s0_), ElementsAre(0));
  EXPECT_TRUE(Attempts(s1_).empty());
  EXPECT_EQ(s0_.service->info_calls.load(), info_calls);
  EXPECT_EQ(group->retries(), 0);
}

TEST_F(GroupRetryTest, GivesUpWhenEveryAttemptFails) {
  auto group = Group();
  s0_.service->fail_streams = 1000;
  s1_.service->fail_streams = 1000;
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  EXPECT_THAT(group->Step("job", "g", 1, 1, 2, {&in, 1}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("attempts (retry deadline of 2m reached)")));
  EXPECT_GT(group->retries(), 10);
  // Each retry passes over the member the last attempt failed on, so the attempts alternate
  // between the two; together they are 0, 1, 2, ... with none lost or repeated.
  std::vector<int> attempts = Attempts(s1_);
  std::vector<int> other = Attempts(s0_);
  EXPECT_FALSE(attempts.empty());
  EXPECT_FALSE(other.empty());
  attempts.insert(attempts.end(), other.begin(), other.end());
  std::sort(attempts.begin(), attempts.end());
  for (size_t i = 0; i < attempts.size(); ++i) EXPECT_EQ(attempts[i], static_cast<int>(i));
}

TEST(GroupClientRouting, PrefersReadyMembersInRankOrder) {
  v1::ServerInfo info;
  info.set_fleet_world(3);
  info.set_fleet_generation(5);
  for (int r = 0; r < 3; ++r) {
    v1::FleetMember* m = info.add_members();
    m->set_rank(r);
    m->set_address("10.0.0." + std::to_string(r) + ":1");
    m->set_ready(r != 1);
  }
  auto group = GroupClient::CreateFromInfo(GroupClient::Options(), info, nullptr);
  ASSERT_OK(group);
  // M = 2 ready members (ranks 0 and 2) for W = 4 trainer ranks: floor(r·2/4).
  std::vector<int> routes;
  for (int r = 0; r < 4; ++r) routes.push_back((*group)->FleetRankFor(r, 4));
  EXPECT_THAT(routes, ElementsAre(0, 0, 2, 2));
  EXPECT_EQ((*group)->FleetRankFor(4, 4), -1);
  EXPECT_EQ((*group)->fleet_generation(), 5);
  EXPECT_EQ((*group)->member_address(2), "10.0.0.2:1");
  EXPECT_NE((*group)->member_client(1), nullptr);

  for (int r = 0; r < 3; ++r) info.mutable_members(r)->set_ready(false);  // None ready: all, by rank.
  group = GroupClient::CreateFromInfo(GroupClient::Options(), info, nullptr);
  ASSERT_OK(group);
  routes.clear();
  for (int r = 0; r < 4; ++r) routes.push_back((*group)->FleetRankFor(r, 4));
  EXPECT_THAT(routes, ElementsAre(0, 0, 1, 2));
}

}  // namespace
}  // namespace orthoserve::client
