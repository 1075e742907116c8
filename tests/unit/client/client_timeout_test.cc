// Clients that cannot hang (issue #26): an attempt that runs out of its own timeout is retried
// (RetryLoop::TimedOut) while the overall deadline allows and at another address or fleet member;
// one cut to the overall deadline, or a server's early DEADLINE_EXCEEDED, is final; a Client with
// several addresses fails over between them and keeps using the one that answered; orthoctl's
// --server takes a comma-separated list. Stalled servers are fake ones (fake_server.h) whose
// chosen calls never answer.
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "client/cpp/orthoctl/commands.h"
#include "client/cpp/orthoctl/connection_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/fake_retry_environment.h"
#include "tests/unit/client/fake_server.h"
#include "tests/unit/client/freezing_proxy.h"
#include "tests/unit/client/input_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::client::testing::FakeRetryEnvironment;
using ::orthoserve::client::testing::FakeServer;
using ::orthoserve::client::testing::FreezingProxy;
using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::F32Input;

std::vector<int> Attempts(FakeServer& server) {
  absl::MutexLock lock(&server.service->mu);
  return server.service->attempts;
}

// A loopback address nothing listens on: a started-and-stopped fake server's.
std::string DeadAddress() {
  FakeServer gone;
  gone.Start();
  const std::string address = gone.address;
  gone.server->Shutdown();
  return address;
}

// Real clock (an attempt's timeout is measured on it), short backoffs.
RetryOptions FastRetries(absl::Duration deadline) {
  RetryOptions r;
  r.deadline = deadline;
  r.initial_backoff = absl::Milliseconds(1);
  r.max_backoff = absl::Milliseconds(5);
  return r;
}

const absl::Status kDeadline = absl::DeadlineExceededError("Deadline Exceeded");

TEST(RetryLoopTimeouts, AnAttemptThatRanOutOfItsTimeoutIsRetried) {
  FakeRetryEnvironment env;
  RetryLoop loop(RetryOptions(), &env, absl::Seconds(10), "call", nullptr);
  EXPECT_EQ(loop.AttemptTimeout(), absl::Seconds(10));
  env.Advance(absl::Seconds(10));
  EXPECT_TRUE(loop.TimedOut(kDeadline));
  EXPECT_TRUE(loop.BackOff(kDeadline));
  EXPECT_EQ(loop.attempt(), 1);
  // Retries disabled: the same failure is final, as it is.
  RetryOptions off;
  off.enabled = false;
  RetryLoop disabled(off, &env, absl::Seconds(10), "call", nullptr);
  disabled.AttemptTimeout();
  env.Advance(absl::Seconds(10));
  EXPECT_FALSE(disabled.BackOff(kDeadline));
  EXPECT_THAT(disabled.GiveUp(kDeadline), StatusIs(absl::StatusCode::kDeadlineExceeded, "Deadline Exceeded"));
}

TEST(RetryLoopTimeouts, ADeadlineExceededBeforeTheTimeoutRanOutIsTheServersAndFinal) {
  FakeRetryEnvironment env;
  RetryLoop loop(RetryOptions(), &env, absl::Seconds(10), "call", nullptr);
  loop.AttemptTimeout();
  env.Advance(absl::Seconds(2));
  EXPECT_FALSE(loop.TimedOut(kDeadline));
  EXPECT_FALSE(loop.BackOff(kDeadline));
  EXPECT_THAT(loop.GiveUp(kDeadline), StatusIs(absl::StatusCode::kDeadlineExceeded, "Deadline Exceeded"));
  // Nor is anything retried as a timeout without a per-attempt timeout.
  RetryLoop unbounded(RetryOptions(), &env, absl::InfiniteDuration(), "call", nullptr);
  unbounded.AttemptTimeout();
  env.Advance(absl::Hours(1));
  EXPECT_FALSE(unbounded.BackOff(kDeadline));
}

TEST(RetryLoopTimeouts, AnAttemptCutToTheOverallDeadlineIsFinal) {
  FakeRetryEnvironment env(/*jitter_fraction=*/0);
  RetryOptions o;
  o.deadline = absl::Seconds(25);
  RetryLoop loop(o, &env, absl::Seconds(10), "call", nullptr);
  for (int i = 0; i < 2; ++i) {  // Two whole attempts of 10 s, each retried.
    EXPECT_EQ(loop.AttemptTimeout(), absl::Seconds(10));
    env.Advance(absl::Seconds(10));
    ASSERT_TRUE(loop.BackOff(kDeadline));
  }
  EXPECT_EQ(loop.AttemptTimeout(), absl::Seconds(5));  // What remains of the 25 s.
  env.Advance(absl::Seconds(5));
  EXPECT_FALSE(loop.TimedOut(kDeadline));
  EXPECT_FALSE(loop.BackOff(kDeadline));
  EXPECT_THAT(loop.GiveUp(kDeadline), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                               "after 3 attempts (retry deadline of 25s reached): Deadline Exceeded"));
}

TEST(ClientFailover, ALoneCallGoesToTheNextAddressAndStaysWithTheOneThatAnswered) {
  FakeServer server;
  server.Start();
  ClientOptions o;
  o.addresses = {DeadAddress(), server.address};
  o.retry = FastRetries(absl::Seconds(20));
  auto client = Client::Create(o);
  ASSERT_OK(client);
  EXPECT_EQ((*client)->address(), o.addresses[0]);
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  ASSERT_OK((*client)->Step(StepOptions{}, {&in, 1}));
  EXPECT_EQ((*client)->retries(), 1);
  EXPECT_EQ((*client)->address(), server.address);
  ASSERT_OK((*client)->Step(StepOptions{}, {&in, 1}));
  ASSERT_OK((*client)->Orthogonalize({&in, 1}));
  ASSERT_OK((*client)->GetServerInfo());
  EXPECT_EQ((*client)->retries(), 1);  // The later calls went to the address that answered.
  EXPECT_THAT(Attempts(server), ElementsAre(1, 0));
  EXPECT_THAT((*client)->addresses(), ElementsAre(o.addresses[0], server.address));
}

TEST(ClientFailover, CreateRejectsAnEmptyAddressAndBadKeepalive) {
  ClientOptions o;
  o.addresses = {"127.0.0.1:1", ""};
  EXPECT_THAT(Client::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("address is empty")));
  ClientOptions k;
  k.keepalive_time = absl::ZeroDuration();
  EXPECT_THAT(Client::Create(k), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keepalive")));
  k = ClientOptions();
  k.keepalive_timeout = absl::InfiniteDuration();
  EXPECT_THAT(Client::Create(k), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keepalive")));
  k = ClientOptions();
  k.keepalive_time = absl::InfiniteDuration();  // No keepalive: allowed.
  EXPECT_OK(Client::Create(k));
  EXPECT_EQ(ClientOptions().timeout, absl::Seconds(90));
  EXPECT_EQ(ClientOptions().keepalive_time, absl::Seconds(10));
  EXPECT_EQ(ClientOptions().keepalive_timeout, absl::Seconds(5));
}

class StalledServerTest : public ::testing::TestWithParam<bool> {};  // Param: unary.

TEST_P(StalledServerTest, AStalledAttemptTimesOutAndGoesToTheNextAddress) {
  const bool unary = GetParam();
  FakeServer stalling, good;
  stalling.Start();
  good.Start();
  (unary ? stalling.service->stall_unary : stalling.service->stall_streams) = 1000;
  ClientOptions o;
  o.addresses = {stalling.address, good.address};
  o.timeout = absl::Milliseconds(300);
  o.retry = FastRetries(absl::Seconds(20));
  o.discover_limits = false;
  auto client = Client::Create(o);
  ASSERT_OK(client);
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  const absl::Time start = absl::Now();
  ASSERT_OK(unary ? (*client)->Orthogonalize({&in, 1}).status() : (*client)->Step(StepOptions{}, {&in, 1}).status());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(295));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_EQ(stalling.service->stalled.load(), 1);
  EXPECT_EQ((*client)->retries(), 1);
  EXPECT_EQ((*client)->address(), good.address);
  if (unary) {
    EXPECT_EQ(good.service->unary_calls.load(), 1);
  } else {
    EXPECT_THAT(Attempts(good), ElementsAre(1));
  }
}

INSTANTIATE_TEST_SUITE_P(StreamAndUnary, StalledServerTest, ::testing::Bool());

TEST(ClientTimeouts, ATimeoutAfterTheRetryDeadlineIsFinal) {
  FakeServer stalling;
  stalling.Start();
  stalling.service->stall_streams = 1000;
  ClientOptions o;
  o.address = stalling.address;
  o.timeout = absl::Milliseconds(400);
  o.retry = FastRetries(absl::Seconds(1));
  o.discover_limits = false;
  auto client = Client::Create(o);
  ASSERT_OK(client);
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  const absl::Time start = absl::Now();
  // 400 ms, 400 ms, then the last ~200 ms of the deadline, which is not retried.
  EXPECT_THAT(
      (*client)->Step(StepOptions{}, {&in, 1}),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("after 3 attempts (retry deadline of 1s reached)")));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(950));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_EQ(stalling.service->stalled.load(), 3);
}

TEST(ClientTimeouts, AServersOwnDeadlineExceededIsFinal) {
  FakeServer server;
  server.Start();
  server.service->fail_streams = 1;
  server.service->fail_code = grpc::StatusCode::DEADLINE_EXCEEDED;  // A collective timed out, say.
  ClientOptions o;
  o.address = server.address;
  o.timeout = absl::Seconds(20);
  o.retry = FastRetries(absl::Seconds(20));
  auto client = Client::Create(o);
  ASSERT_OK(client);
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  EXPECT_THAT((*client)->Step(StepOptions{}, {&in, 1}),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "injected failure"));
  EXPECT_EQ((*client)->retries(), 0);
  EXPECT_THAT(Attempts(server), ElementsAre(0));
}

TEST(GroupClientTimeouts, AStalledMemberIsPassedOverOnTheRetry) {
  FakeServer s0, s1;
  s0.Start();
  s1.Start();
  for (FakeServer* s : {&s0, &s1}) s->service->members = {s0.address, s1.address};
  s1.service->fleet_rank = 1;
  s1.service->stall_streams = 1000;  // Member 1 hangs, yet still says it is ready.
  GroupClient::Options options;
  options.client.address = s0.address;
  options.client.timeout = absl::Milliseconds(300);
  options.client.retry = FastRetries(absl::Seconds(20));
  options.run_id = "run-t";
  auto group = GroupClient::Create(options);
  ASSERT_OK(group);
  EXPECT_EQ((*group)->FleetRankFor(1, 2), 1);
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {8, 4}, a);
  in.block = Block{4, 0, 4, 4};
  const absl::Time start = absl::Now();
  ASSERT_OK((*group)->Step("job", "g", 3, 1, 2, {&in, 1}));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(s1.service->stalled.load(), 1);
  EXPECT_THAT(Attempts(s1), ElementsAre(0));
  EXPECT_THAT(Attempts(s0), ElementsAre(1));
  EXPECT_EQ((*group)->retries(), 1);
}

TEST(GroupClientTimeouts, DiscoversTheFleetThroughTheNextSeedAddress) {
  FakeServer s0;
  s0.Start();
  GroupClient::Options options;
  options.client.addresses = {DeadAddress(), s0.address};
  options.client.retry = FastRetries(absl::Seconds(20));
  options.run_id = "run-s";
  auto group = GroupClient::Create(options);
  ASSERT_OK(group);
  EXPECT_EQ((*group)->member_address(0), s0.address);
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  ASSERT_OK((*group)->Step("job", "g", 1, 0, 1, {&in, 1}));
  EXPECT_THAT(Attempts(s0), ElementsAre(0));
}

TEST(ClientKeepalive, AnUnansweredKeepalivePingEndsACallWhosePeerWentSilent) {
  FakeServer server;
  server.Start();
  server.service->stall_streams = 1000;  // The call stays in flight, with nothing on the wire.
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(server.address.substr(server.address.rfind(':') + 1), &port));
  FreezingProxy proxy(port);
  ASSERT_FALSE(proxy.address().empty());
  ClientOptions o;
  o.address = proxy.address();
  o.timeout = absl::Seconds(20);  // Only a bound for this test: keepalive must end the call long before.
  o.retry.enabled = false;
  o.keepalive_time = absl::Milliseconds(500);
  o.keepalive_timeout = absl::Milliseconds(500);
  auto client = Client::Create(o);
  ASSERT_OK(client);
  ASSERT_OK((*client)->GetServerInfo());  // Connected; the limits known.
  std::thread freezer([&] {
    absl::SleepFor(absl::Milliseconds(200));
    proxy.Freeze();
  });
  const std::vector<float> a(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  const absl::Time start = absl::Now();
  const absl::Status status = (*client)->Step(StepOptions{}, {&in, 1}).status();
  const absl::Duration took = absl::Now() - start;
  freezer.join();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_EQ(server.service->stalled.load(), 1);
}

TEST(OrthoctlServers, ACommaSeparatedServerListBecomesTheClientsAddresses) {
  orthoctl::ConnectionFlagValues v;
  v.server = "a:1, b:2,c:3";
  auto o = orthoctl::ClientOptionsFromFlags(v);
  ASSERT_OK(o);
  EXPECT_THAT(o->addresses, ElementsAre("a:1", "b:2", "c:3"));
  EXPECT_EQ(o->address, "a:1");
  EXPECT_EQ(o->timeout, absl::Seconds(90));
  v.server = "host:5";
  o = orthoctl::ClientOptionsFromFlags(v);
  ASSERT_OK(o);
  EXPECT_THAT(o->addresses, ElementsAre("host:5"));
  // gRPC's own ipv4:/ipv6: address lists keep their commas.
  auto grpc_list = orthoctl::ServerAddresses("ipv4:10.0.0.1:5,10.0.0.2:5");
  ASSERT_OK(grpc_list);
  EXPECT_THAT(*grpc_list, ElementsAre("ipv4:10.0.0.1:5,10.0.0.2:5"));
  EXPECT_THAT(orthoctl::ServerAddresses("a:1,,b:2"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty address")));
}

TEST(OrthoctlServers, OrthoctlFailsOverToTheNextServer) {
  FakeServer server;
  server.Start();
  std::ostringstream out, err;
  EXPECT_EQ(orthoctl::RunInfo({"--server", DeadAddress() + "," + server.address, "--retry-deadline", "20"}, out, err),
            orthoctl::kExitOk)
      << err.str();
  EXPECT_EQ(server.service->info_calls.load(), 1);
}

}  // namespace
}  // namespace orthoserve::client
