// Client, GroupClient and orthoctl end to end over loopback gRPC against the in-process fake
// server (tests/unit/client/fake_server.h): chunking, reassembly, pipelining, errors, metadata,
// health and fleet routing.
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "client/cpp/npy.h"
#include "client/cpp/orthoctl/commands.h"
#include "gmock/gmock.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "tests/unit/client/input_util.h"
#include "tests/unit/client/fake_server.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::client::testing::FakeServer;
using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 101) - 50);
  return v;
}

using testing_util::F32Input;

std::vector<float> AsFloats(const MatrixOutput& out) {
  std::vector<float> v(out.data.size() / ElementSize(out.dtype));
  ConvertToF32(out.dtype, out.data.data(), v.size(), v.data());
  return v;
}

std::unique_ptr<Client> Connect(const FakeServer& server, ClientOptions options = {}) {
  options.address = server.address;
  options.timeout = absl::Seconds(20);
  auto c = Client::Create(options);
  EXPECT_OK(c);
  return *std::move(c);
}

class ClientLoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override { server_.Start(); }
  FakeServer server_;
};

TEST_F(ClientLoopbackTest, StepChunksToTheServerLimitAndReassemblesResults) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(300 * 7, 0.5f), b = Ramp(4 * 5, 1.0f), c = Ramp(6 * 4, 0.25f);
  std::vector<MatrixInput> inputs = {F32Input("a", {300, 7}, a), F32Input("b", {4, 5}, b), F32Input("c", {6, 4}, c)};
  inputs[1].result_dtype = DType::kBF16;
  inputs[2].block = Block{3, 0, 3, 4};
  inputs[2].bytes = 12 * sizeof(float);
  std::vector<int> seen;
  auto out = client->Step(StepOptions{}, inputs, [&](const MatrixOutput& o) { seen.push_back(o.index); });
  ASSERT_OK(out);
  EXPECT_EQ(client->chunk_bytes(), 1000u);                          // Lowered from 4 MiB by GetServerInfo.
  EXPECT_EQ(server_.service->largest_chunk_received.load(), 1000);  // 8400 bytes went as 8×1000 + 400.
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(out->size(), 3u);
  for (const MatrixOutput& o : *out) EXPECT_OK(o.status);
  std::vector<float> got_a = AsFloats((*out)[0]);
  ASSERT_EQ(got_a.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(got_a[i], 2 * a[i]) << i;
  EXPECT_EQ((*out)[0].block, (Block{0, 0, 300, 7}));
  EXPECT_EQ((*out)[1].dtype, DType::kBF16);
  EXPECT_EQ((*out)[1].data.size(), 20u * 2);
  EXPECT_EQ(AsFloats((*out)[1])[3], 2 * b[3]);  // Small integers are exact in bf16.
  EXPECT_EQ((*out)[2].block, (Block{3, 0, 3, 4}));
  EXPECT_EQ(AsFloats((*out)[2]), (std::vector<float>{2 * c[0], 2 * c[1], 2 * c[2], 2 * c[3], 2 * c[4], 2 * c[5],
                                                     2 * c[6], 2 * c[7], 2 * c[8], 2 * c[9], 2 * c[10], 2 * c[11]}));
  ASSERT_TRUE(client->last_summary().has_value());
  EXPECT_EQ(client->last_summary()->matrices_ok(), 3);
}

TEST_F(ClientLoopbackTest, StepSendsTheGroupHeader) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(8, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  in.block = Block{0, 0, 2, 4};
  ASSERT_OK(client->Step(StepOptions{"job1", "tp", 12, 0, 2, "run"}, {&in, 1}));
  absl::MutexLock lock(&server_.service->mu);
  EXPECT_EQ(server_.service->last_header.job(), "job1");
  EXPECT_EQ(server_.service->last_header.group(), "tp");
  EXPECT_EQ(server_.service->last_header.step(), 12);
  EXPECT_EQ(server_.service->last_header.world(), 2);
  EXPECT_EQ(server_.service->last_header.num_matrices(), 1);
}

TEST_F(ClientLoopbackTest, PerMatrixErrorsTravelInBand) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(16, 1.0f);
  std::vector<MatrixInput> inputs = {F32Input("bad_w", {4, 4}, a), F32Input("good", {4, 4}, a)};
  auto out = client->Step(StepOptions{}, inputs);
  ASSERT_OK(out);
  EXPECT_THAT((*out)[0].status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps = 101")));
  EXPECT_TRUE((*out)[0].data.empty());
  EXPECT_OK((*out)[1].status);
  EXPECT_EQ(client->last_summary()->matrices_failed(), 1);
}

// A server older than MatrixSpec.nd_layout reads a batch flattened and does not echo the layout:
// the client refuses that answer (FAILED_PRECONDITION) instead of returning it as the batch's.
TEST_F(ClientLoopbackTest, ABatchAnsweredByAServerThatIgnoresTheLayoutIsRefused) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(24, 1.0f);
  MatrixInput batch = F32Input("b", {2, 3, 4}, a);
  batch.layout = NdLayout::kBatch;
  EXPECT_OK(client->Step(StepOptions{}, {&batch, 1}));  // Echoed: accepted.
  server_.service->echo_nd_layout = false;
  EXPECT_THAT(client->Step(StepOptions{}, {&batch, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("matrix \"b\": the server did not read it as a batch")));
  EXPECT_THAT(client->Orthogonalize({&batch, 1}), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("nd_layout")));
  MatrixInput flat = F32Input("f", {2, 3, 4}, a);  // Flattened inputs are what such a server computes.
  EXPECT_OK(client->Step(StepOptions{}, {&flat, 1}));
}

// A server older than NsOptions.normalization normalizes in fp32 and does not echo bf16: the
// client refuses that answer (FAILED_PRECONDITION) for a matrix that asked for bf16.
TEST_F(ClientLoopbackTest, ABf16NormalizationAnsweredByAServerThatIgnoresItIsRefused) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(16, 1.0f);
  MatrixInput torch_order = F32Input("t", {4, 4}, a);
  torch_order.options.normalization = Normalization::kBf16;
  auto echoed = client->Step(StepOptions{}, {&torch_order, 1});
  ASSERT_OK(echoed);
  EXPECT_EQ((*echoed)[0].normalization, Normalization::kBf16);
  server_.service->echo_normalization = false;
  EXPECT_THAT(client->Step(StepOptions{}, {&torch_order, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("matrix \"t\": the server did not normalize it in bf16")));
  EXPECT_THAT(client->Orthogonalize({&torch_order, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("normalization bf16")));
  MatrixInput fp32 = F32Input("f", {4, 4}, a);  // fp32 normalization is what such a server computes.
  EXPECT_OK(client->Step(StepOptions{}, {&fp32, 1}));
}

TEST_F(ClientLoopbackTest, AResultForAnotherMatrixOrAnotherRanksBlockIsNeverReturned) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(16, 1.0f);
  MatrixInput rows = F32Input("w", {4, 4}, a);
  rows.block = Block{0, 0, 2, 4};
  rows.bytes = 8 * sizeof(float);
  const StepOptions group{"job", "tp", 1, 0, 2, "run"};
  ASSERT_OK(client->Step(group, {&rows, 1}));
  server_.service->result_row_shift = 2;  // Rank 1's block: same size, not ours.
  EXPECT_THAT(client->Step(group, {&rows, 1}),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("its block is rows 2+2, cols 0+4, sent rows 0+2, cols 0+4")));
  server_.service->result_row_shift = 0;
  server_.service->result_name = "other";
  EXPECT_THAT(client->Step(group, {&rows, 1}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("result 0 is named \"other\", but matrix 0 is \"w\"")));
  MatrixInput whole = F32Input("w", {4, 4}, a);
  EXPECT_THAT(client->Orthogonalize({&whole, 1}), StatusIs(absl::StatusCode::kInternal, HasSubstr("result 0 is for matrix 0 \"other\"")));
}

TEST_F(ClientLoopbackTest, StreamFailureReturnsTheServersStatus) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  EXPECT_THAT(client->Step(StepOptions{"abort", "x", 7, 0, 1, ""}, {&in, 1}),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("step 7 of group abort/x aborted")));
}

TEST_F(ClientLoopbackTest, ResultsArriveWhileLaterMatricesAreStillBeingSent) {
  // The server sends result 0 and then stops reading until the client has seen it. A client that
  // wrote everything before reading would stall on flow control with 16 MiB still unsent.
  auto gate = std::make_shared<absl::Notification>();
  server_.service->gate = gate;
  server_.service->chunk_bytes = 1 << 20;
  auto client = Connect(server_);
  const std::vector<float> small = Ramp(16, 1.0f), big = Ramp(2048 * 2048, 1.0f);
  std::vector<MatrixInput> inputs = {F32Input("first", {4, 4}, small), F32Input("big", {2048, 2048}, big)};
  auto out = client->Step(StepOptions{}, inputs, [&](const MatrixOutput& o) {
    if (o.index == 0) gate->Notify();
  });
  ASSERT_OK(out);
  EXPECT_TRUE(gate->HasBeenNotified());
  EXPECT_EQ(AsFloats((*out)[1])[12345], 2 * big[12345]);
}

TEST_F(ClientLoopbackTest, ASlowResultCallbackRunsOnTheCallersThreadAndLosesNothing) {
  // Many chunked results and an on_result slower than the stream: responses wait for the caller
  // (reading pauses and resumes) and each callback runs on the thread that called Step.
  auto client = Connect(server_);
  std::vector<std::vector<float>> data;
  std::vector<MatrixInput> inputs;
  for (int i = 0; i < 24; ++i) data.push_back(Ramp(40 * 30, 0.5f + i));
  for (int i = 0; i < 24; ++i) inputs.push_back(F32Input(absl::StrCat("m", i), {40, 30}, data[i]));
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int> seen;
  auto out = client->Step(StepOptions{}, inputs, [&](const MatrixOutput& o) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    seen.push_back(o.index);
    absl::SleepFor(absl::Milliseconds(5));
  });
  ASSERT_OK(out);
  EXPECT_EQ(seen.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<float> got = AsFloats((*out)[i]);
    ASSERT_EQ(got.size(), data[i].size());
    for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], 2 * data[i][k]) << i << " " << k;
  }
}

TEST_F(ClientLoopbackTest, DeadlineExceeded) {
  auto never = std::make_shared<absl::Notification>();
  server_.service->gate = never;
  ClientOptions options;
  options.address = server_.address;
  options.timeout = absl::Milliseconds(500);
  // Each attempt that runs out of its timeout is retried until the retry deadline (its last one is
  // cut to what remains of it, and that DEADLINE_EXCEEDED is final).
  options.retry.deadline = absl::Milliseconds(1200);
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_backoff = absl::Milliseconds(5);
  auto client = Client::Create(options);
  ASSERT_OK(client);
  const std::vector<float> a = Ramp(16, 1.0f);
  std::vector<MatrixInput> inputs = {F32Input("a", {4, 4}, a), F32Input("b", {4, 4}, a)};
  const absl::Time start = absl::Now();
  EXPECT_THAT((*client)->Step(StepOptions{}, inputs),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("after 3 attempts (retry deadline of 1.2s")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ((*client)->retries(), 2);
  never->Notify();  // Lets the server's handler finish promptly.
}

TEST_F(ClientLoopbackTest, ServerProtocolViolationIsInternal) {
  server_.service->send_extra_byte = true;
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  EXPECT_THAT(client->Step(StepOptions{}, {&in, 1}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("more than the 64 of its block")));
}

TEST_F(ClientLoopbackTest, UnaryRoundTripAndBadInputs) {
  auto client = Connect(server_);
  const std::vector<float> a = Ramp(6, 1.5f);
  std::vector<MatrixInput> inputs = {F32Input("a", {2, 3}, a), F32Input("bad", {3, 2}, a)};
  auto out = client->Orthogonalize(inputs);
  ASSERT_OK(out);
  EXPECT_EQ(AsFloats((*out)[0]), (std::vector<float>{2 * a[0], 2 * a[1], 2 * a[2], 2 * a[3], 2 * a[4], 2 * a[5]}));
  EXPECT_THAT((*out)[1].status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad")));
  std::vector<MatrixInput> twice = {F32Input("a", {2, 3}, a), F32Input("a", {2, 3}, a)};
  EXPECT_THAT(client->Step(StepOptions{}, twice), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(client->Orthogonalize({}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no matrices")));
  EXPECT_THAT(client->Step(StepOptions{"", "", 0, 2, 2, "run"}, {&inputs[0], 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 of world 2")));
  EXPECT_EQ(server_.service->streams.load(), 0);  // Nothing bad was sent.
}

TEST_F(ClientLoopbackTest, BearerTokenMetadata) {
  server_.service->required_token = "s3cret";
  ClientOptions options;
  options.bearer_token = "s3cret";
  auto client = Connect(server_, options);
  ASSERT_OK(client->GetServerInfo());
  {
    absl::MutexLock lock(&server_.service->mu);
    EXPECT_EQ(server_.service->last_authorization, "Bearer s3cret");
  }
  options.bearer_token = "wrong";
  auto wrong = Connect(server_, options);
  EXPECT_THAT(wrong->GetServerInfo(), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("bearer token")));
  const std::vector<float> a = Ramp(16, 1.0f);
  MatrixInput in = F32Input("w", {4, 4}, a);
  EXPECT_THAT(wrong->Step(StepOptions{}, {&in, 1}), StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
}

TEST_F(ClientLoopbackTest, HealthFollowsTheServingStatus) {
  auto client = Connect(server_);
  EXPECT_OK(client->Health());
  server_.server->GetHealthCheckService()->SetServingStatus(false);
  EXPECT_THAT(client->Health(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("NOT_SERVING")));
}

TEST(ClientLoopback, UnreachableServerIsUnavailable) {
  ClientOptions options;
  options.address = "127.0.0.1:1";
  options.timeout = absl::Seconds(5);
  options.retry.enabled = false;
  auto client = Client::Create(options);
  ASSERT_OK(client);
  EXPECT_THAT((*client)->Health(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_THAT((*client)->GetServerInfo(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_EQ((*client)->retries(), 0);
}

TEST(ClientOptions, RejectsBadCombinations) {
  ClientOptions o;
  o.address = "";
  EXPECT_THAT(Client::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("address")));
  o.address = "x:1";
  o.tls_cert_file = "cert.pem";
  EXPECT_THAT(Client::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key")));
  o.tls_key_file = "key.pem";
  EXPECT_THAT(Client::Create(o), StatusIs(absl::StatusCode::kNotFound, HasSubstr("cert.pem")));
  ClientOptions no_tls;
  no_tls.tls_server_name = "orthoserve";
  EXPECT_THAT(Client::Create(no_tls), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without TLS")));
  ClientOptions zero;
  zero.timeout = absl::ZeroDuration();
  EXPECT_THAT(Client::Create(zero), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
}

TEST(GroupClientLoopback, TrainerRanksStreamToFloorRSOverW) {
  FakeServer s0, s1;
  s0.Start();
  s1.Start();
  for (FakeServer* s : {&s0, &s1}) s->service->members = {s0.address, s1.address};
  s1.service->fleet_rank = 1;
  GroupClient::Options options;
  options.client.address = s1.address;  // Any member is a seed.
  auto group = GroupClient::Create(options);
  ASSERT_OK(group);
  EXPECT_EQ((*group)->fleet_world(), 2);
  EXPECT_EQ((*group)->member_address(0), s0.address);
  const std::vector<float> a = Ramp(8, 1.0f);
  std::vector<int> served_by;
  for (int rank = 0; rank < 4; ++rank) {  // W = 4 trainer ranks over S = 2: 0,1 -> 0 and 2,3 -> 1.
    MatrixInput in = F32Input("w", {8, 4}, a);
    in.block = Block{2 * rank, 0, 2, 4};
    ASSERT_OK((*group)->Step("job", "fsdp", 1, rank, 4, {&in, 1}));
    served_by.push_back(s1.service->streams.load() * 10 + s0.service->streams.load());
  }
  EXPECT_EQ(served_by, (std::vector<int>{1, 2, 12, 22}));
  MatrixInput in = F32Input("w", {8, 4}, a);
  EXPECT_THAT((*group)->Step("job", "fsdp", 1, 4, 4, {&in, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4 of world 4")));
}

TEST(GroupClientLoopback, RejectsUnusableMembership) {
  v1::ServerInfo info;
  info.set_fleet_world(2);
  GroupClient::Options options;
  EXPECT_THAT(GroupClient::CreateFromInfo(options, info, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no fleet members for fleet_world 2")));
  info.add_members()->set_address("a:1");
  v1::FleetMember* m = info.add_members();
  m->set_rank(0);
  m->set_address("b:1");
  EXPECT_THAT(GroupClient::CreateFromInfo(options, info, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ordered by rank")));
  m->set_rank(5);  // Gaps are allowed: an elastic fleet lists the ranks it has.
  EXPECT_OK(GroupClient::CreateFromInfo(options, info, nullptr));
  m->clear_address();
  EXPECT_THAT(GroupClient::CreateFromInfo(options, info, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no public address")));
  info.set_fleet_world(0);
  EXPECT_THAT(GroupClient::CreateFromInfo(options, info, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fleet_world 0")));
}

TEST_F(ClientLoopbackTest, OrthoctlSubcommands) {
  using namespace orthoserve::orthoctl;  // NOLINT(build/namespaces)
  const std::string dir = ::testing::TempDir();
  NpyArray in;
  in.dtype = DType::kF16;
  in.shape = {3, 2, 2};
  for (int i = 0; i < 12; ++i) {
    const uint16_t h = FloatToHalf(static_cast<float>(i) - 6.0f);
    in.data.push_back(static_cast<char>(h & 0xff));
    in.data.push_back(static_cast<char>(h >> 8));
  }
  ASSERT_OK(WriteNpy(dir + "/in.npy", in));
  std::ostringstream out, err;
  ASSERT_EQ(RunOrthogonalize({"--in", dir + "/in.npy", "--out", dir + "/out.npy", "--server", server_.address,
                              "--wire-dtype", "fp32", "--steps", "3"},
                             out, err),
            kExitOk)
      << err.str();
  auto result = ReadNpy(dir + "/out.npy");
  ASSERT_OK(result);
  EXPECT_EQ(result->dtype, DType::kF16);  // Back in the input's dtype and shape.
  EXPECT_EQ(result->shape, in.shape);
  for (int i = 0; i < 12; ++i) {
    uint16_t h;
    std::memcpy(&h, result->data.data() + 2 * i, 2);
    EXPECT_EQ(HalfToFloat(h), 2.0f * (static_cast<float>(i) - 6.0f));
  }
  EXPECT_THAT(out.str(), HasSubstr("out.npy: [3, 2, 2] fp16"));

  std::ostringstream info_out, info_err;
  ASSERT_EQ(RunInfo({"--server", server_.address, "--json"}, info_out, info_err), kExitOk) << info_err.str();
  EXPECT_THAT(info_out.str(), HasSubstr("\"chunk_bytes\": \"1000\""));
  std::ostringstream health_out, health_err;
  EXPECT_EQ(RunHealth({"--server", server_.address}, health_out, health_err), kExitOk);
  EXPECT_EQ(health_out.str(), "SERVING\n");
  std::ostringstream bench_out, bench_err;
  ASSERT_EQ(
      RunBench({"--server", server_.address, "--shape", "16,8", "--matrices", "2", "--iters", "3", "--warmup", "1"},
               bench_out, bench_err),
      kExitOk)
      << bench_err.str();
  EXPECT_THAT(bench_out.str(), HasSubstr("latency:    median"));
  EXPECT_THAT(bench_out.str(), HasSubstr(" p99 "));
  EXPECT_EQ(server_.service->streams.load(), 1 + 4);

  // In-band error: exit 2 with the server's message.
  std::ostringstream bad_out, bad_err;
  EXPECT_EQ(RunOrthogonalize({"--in", dir + "/in.npy", "--out", dir + "/bad_out.npy", "--name", "bad_m", "--server",
                              server_.address},
                             bad_out, bad_err),
            kExitRpc);
  EXPECT_THAT(bad_err.str(), HasSubstr("steps = 101"));
  server_.server->GetHealthCheckService()->SetServingStatus(false);
  std::ostringstream down_out, down_err;
  EXPECT_EQ(RunHealth({"--server", server_.address}, down_out, down_err), kExitRpc);
  EXPECT_THAT(down_err.str(), HasSubstr("NOT_SERVING"));
}

}  // namespace
}  // namespace orthoserve::client
