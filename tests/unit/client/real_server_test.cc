// The C++ client against the real service: an in-process orthoserve Server (server/app) on
// 127.0.0.1:0 with the CPU backend, a 4 KiB chunk limit and a token file. Checks that the client's
// chunked stream path agrees with the unary path, that results are orthogonal, that per-matrix
// errors come back in-band, that a two-rank group's blocks reassemble to the whole result, and
// token handling.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/unit/client/input_util.h"
#include "server/app/server.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kToken[] = "client-test-token";

std::vector<float> Random(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x >> 8) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

std::vector<float> AsFloats(const MatrixOutput& out) {
  std::vector<float> v(out.data.size() / ElementSize(out.dtype));
  ConvertToF32(out.dtype, out.data.data(), v.size(), v.data());
  return v;
}

MatrixInput Input(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& data) {
  MatrixInput in = testing_util::F32Input(name, std::move(shape), data);
  in.options.coefficients = CoefficientType::kPolarExpress;
  in.options.steps = 10;
  in.options.precision = Precision::kHighest;
  in.options.scale_mode = ScaleMode::kNone;
  return in;
}

class RealServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    token_file_ = new std::string(::testing::TempDir() + "/client_real_server_tokens");
    {
      std::ofstream out(*token_file_);
      out << kToken << " tenant-a\n";
    }
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_address = "";
    o.fleet_listen = "127.0.0.1:0";
    o.service.chunk_bytes = 4096;
    o.token_file = *token_file_;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(o);
    ASSERT_OK(server);
    server_ = server->release();
    address_ = new std::string("127.0.0.1:" + std::to_string(server_->port()));
    std::unique_ptr<Client> client = Connect(kToken);
    absl::Status health = client->Health();
    for (int i = 0; i < 100 && !health.ok(); ++i) {  // The fleet forms in the background.
      absl::SleepFor(absl::Milliseconds(100));
      health = client->Health();
    }
    ASSERT_OK(health);
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) server_->Drain();
    delete server_;
    server_ = nullptr;
    std::remove(token_file_->c_str());
    delete token_file_;
    delete address_;
  }

  static std::unique_ptr<Client> Connect(const std::string& token) {
    ClientOptions o;
    o.address = *address_;
    o.timeout = absl::Seconds(60);
    o.bearer_token = token;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
    EXPECT_OK(c);
    return *std::move(c);
  }

  static Server* server_;
  static std::string* address_;
  static std::string* token_file_;
};

Server* RealServerTest::server_ = nullptr;
std::string* RealServerTest::address_ = nullptr;
std::string* RealServerTest::token_file_ = nullptr;

TEST_F(RealServerTest, InfoReportsTheChunkLimitTheClientUses) {
  std::unique_ptr<Client> client = Connect(kToken);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().chunk_bytes(), 4096);
  EXPECT_EQ(info->fleet_world(), 1);
  EXPECT_TRUE(info->auth_required());
  EXPECT_EQ(client->chunk_bytes(), 4096u);
}

TEST_F(RealServerTest, ChunkedStreamAgreesWithUnaryAndIsOrthogonal) {
  std::unique_ptr<Client> client = Connect(kToken);
  const std::vector<float> a = Random(96 * 40, 1), b = Random(8 * 4 * 5, 2);
  std::vector<MatrixInput> inputs = {Input("a", {96, 40}, a), Input("b", {8, 4, 5}, b)};
  inputs[1].result_dtype = DType::kBF16;
  int callbacks = 0;
  absl::StatusOr<std::vector<MatrixOutput>> streamed =
      client->Step(StepOptions{}, inputs, [&](const MatrixOutput&) { ++callbacks; });
  ASSERT_OK(streamed);
  EXPECT_EQ(callbacks, 2);
  absl::StatusOr<std::vector<MatrixOutput>> unary = client->Orthogonalize(inputs);
  ASSERT_OK(unary);
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK((*streamed)[i].status);
    ASSERT_OK((*unary)[i].status);
    EXPECT_EQ((*streamed)[i].dtype, i == 0 ? DType::kF32 : DType::kBF16);
    EXPECT_EQ((*streamed)[i].dtype, (*unary)[i].dtype);
    EXPECT_EQ((*streamed)[i].shape, inputs[i].shape);
    const std::vector<float> s = AsFloats((*streamed)[i]), u = AsFloats((*unary)[i]);
    ASSERT_EQ(s.size(), u.size());
    double worst = 0;
    for (size_t k = 0; k < s.size(); ++k) worst = std::max(worst, std::fabs(double{s[k]} - u[k]));
    EXPECT_LE(worst, 1e-6) << "matrix " << i;
  }
  // 96 x 40 after 10 polar-express steps at HIGHEST precision: XᵀX = I to about 1e-3.
  const std::vector<float> x = AsFloats((*streamed)[0]);
  double worst = 0;
  for (int j = 0; j < 40; ++j) {
    for (int k = 0; k < 40; ++k) {
      double dot = 0;
      for (int r = 0; r < 96; ++r) dot += double{x[r * 40 + j]} * x[r * 40 + k];
      worst = std::max(worst, std::fabs(dot - (j == k ? 1.0 : 0.0)));
    }
  }
  EXPECT_LT(worst, 5e-3);
}

// Results written into the caller's buffers (MatrixInput::result) are the bytes a call returns in
// MatrixOutput::data, for streams and unary calls, in any result dtype; the output is then
// marked in place and carries no data of its own.
TEST_F(RealServerTest, ResultsGoIntoCallerBuffersWithTheSameBytes) {
  std::unique_ptr<Client> client = Connect(kToken);
  const std::vector<float> a = Random(96 * 40, 5), b = Random(8 * 4 * 5, 6);
  std::vector<MatrixInput> inputs = {Input("a", {96, 40}, a), Input("b", {8, 4, 5}, b)};
  inputs[1].result_dtype = DType::kBF16;
  absl::StatusOr<std::vector<MatrixOutput>> returned = client->Step(StepOptions{}, inputs);
  ASSERT_OK(returned);
  for (bool unary : {false, true}) {
    SCOPED_TRACE(unary ? "unary" : "stream");
    std::vector<std::vector<char>> buffers = {std::vector<char>(96 * 40 * 4, 'x'), std::vector<char>(8 * 4 * 5 * 2, 'x')};
    std::vector<MatrixInput> into = inputs;
    for (size_t i = 0; i < into.size(); ++i) {
      into[i].result = buffers[i].data();
      into[i].result_bytes = buffers[i].size();
    }
    absl::StatusOr<std::vector<MatrixOutput>> out = unary ? client->Orthogonalize(into) : client->Step(StepOptions{}, into);
    ASSERT_OK(out);
    for (size_t i = 0; i < into.size(); ++i) {
      ASSERT_OK((*out)[i].status);
      EXPECT_TRUE((*out)[i].in_place);
      EXPECT_TRUE((*out)[i].data.empty());
      EXPECT_EQ(buffers[i], (*returned)[i].data) << "matrix " << i;
    }
  }
}

// A result buffer of the wrong size, or one that overlaps an input's data or another result
// buffer, is refused before anything is sent, naming the matrix.
TEST_F(RealServerTest, ResultBuffersOfTheWrongSizeOrOverlappingAreRefused) {
  std::unique_ptr<Client> client = Connect(kToken);
  std::vector<float> a = Random(96 * 40, 7), b = Random(96 * 40, 8);
  std::vector<char> buffer(96 * 40 * 4), other(96 * 40 * 4);
  std::vector<MatrixInput> inputs = {Input("a", {96, 40}, a), Input("b", {96, 40}, b)};
  inputs[0].result = buffer.data();
  inputs[0].result_bytes = buffer.size() - 4;
  EXPECT_THAT(client->Step(StepOptions{}, inputs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"a\": result buffer of 15356 bytes")));
  inputs[0].result_bytes = buffer.size();
  inputs[1].result = b.data();  // Over its own input.
  inputs[1].result_bytes = b.size() * sizeof(float);
  EXPECT_THAT(client->Orthogonalize(inputs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("matrix \"b\": its result buffer overlaps the input data of matrix \"b\"")));
  inputs[1].result = buffer.data() + 4;  // Over a's result.
  EXPECT_THAT(client->Step(StepOptions{}, inputs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps the result buffer of matrix")));
  inputs[1].result = a.data();  // Over a's input.
  EXPECT_THAT(client->Step(StepOptions{}, inputs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps the input data of matrix \"a\"")));
  inputs[1].result = other.data();
  ASSERT_OK(client->Step(StepOptions{}, inputs).status());
}

TEST_F(RealServerTest, PerMatrixErrorsComeBackInBand) {
  std::unique_ptr<Client> client = Connect(kToken);
  const std::vector<float> a = Random(96 * 40, 3);
  std::vector<MatrixInput> inputs = {Input("qkv", {96, 40}, a), Input("fine", {96, 40}, a)};
  inputs[0].options.split_qkv = {3, 2, 2};  // 96 rows are not divisible by 7.
  absl::StatusOr<std::vector<MatrixOutput>> out = client->Step(StepOptions{}, inputs);
  ASSERT_OK(out);
  EXPECT_THAT((*out)[0].status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("split_qkv")));
  EXPECT_TRUE((*out)[0].data.empty());
  EXPECT_OK((*out)[1].status);
  ASSERT_TRUE(client->last_summary().has_value());
  EXPECT_EQ(client->last_summary()->matrices_failed(), 1);
}

TEST_F(RealServerTest, TwoRankGroupBlocksReassembleToTheWholeResult) {
  const std::vector<float> g = Random(64 * 24, 4);
  std::unique_ptr<Client> lone = Connect(kToken);
  MatrixInput whole = Input("w", {64, 24}, g);
  absl::StatusOr<std::vector<MatrixOutput>> reference = lone->Step(StepOptions{}, {&whole, 1});
  ASSERT_OK(reference);
  ASSERT_OK((*reference)[0].status);
  const std::vector<float> expected = AsFloats((*reference)[0]);

  GroupClient::Options options;
  options.client.address = *address_;
  options.client.bearer_token = kToken;
  options.client.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<GroupClient>> group = GroupClient::Create(options);
  ASSERT_OK(group);
  EXPECT_EQ((*group)->fleet_world(), 1);
  std::vector<absl::StatusOr<std::vector<MatrixOutput>>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  ranks.reserve(2);
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      MatrixInput in = Input("w", {64, 24}, g);
      in.block = Block{32 * rank, 0, 32, 24};
      in.data = g.data() + 32 * 24 * rank;
      in.bytes = 32 * 24 * sizeof(float);
      results[rank] = (*group)->Step("client-test", "rows", 1, rank, 2, {&in, 1});
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_OK(results[rank]);
    const MatrixOutput& out = (*results[rank])[0];
    ASSERT_OK(out.status);
    EXPECT_EQ(out.block, (Block{32 * rank, 0, 32, 24}));
    const std::vector<float> got = AsFloats(out);
    ASSERT_EQ(got.size(), 32u * 24);
    double worst = 0;
    for (size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::fabs(double{got[k]} - expected[32 * 24 * rank + k]));
    EXPECT_LE(worst, 1e-5) << "rank " << rank;
  }
}

TEST_F(RealServerTest, CallsWithoutTheTokenAreUnauthenticated) {
  std::unique_ptr<Client> anonymous = Connect("");
  EXPECT_THAT(anonymous->GetServerInfo(), StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  std::unique_ptr<Client> wrong = Connect("not-the-token");
  const std::vector<float> a = Random(16, 5);
  MatrixInput in = Input("w", {4, 4}, a);
  EXPECT_THAT(wrong->Orthogonalize({&in, 1}), StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  ClientOptions o;
  o.address = *address_;
  o.bearer_token = "not-the-token";
  o.discover_limits = false;  // Straight to the stream, which must refuse it.
  absl::StatusOr<std::unique_ptr<Client>> direct = Client::Create(o);
  ASSERT_OK(direct);
  EXPECT_THAT((*direct)->Step(StepOptions{}, {&in, 1}), StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
}

}  // namespace
}  // namespace orthoserve::client

namespace orthoserve::client {
namespace {

// A free loopback port (bound and released; the small race is acceptable in a test).
int FreePort() {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> probe = builder.BuildAndStart();
  probe->Shutdown();
  return port;
}

// Two in-process ranks of one fleet on loopback, formed; `adjust` changes each rank's options.
struct TwoRankFleet {
  std::vector<std::unique_ptr<Server>> ranks;
  std::vector<std::string> addresses;
};
void StartTwoRankFleet(TwoRankFleet& fleet, const std::function<void(ServerOptions&)>& adjust = nullptr) {
  const int fleet_port = FreePort();
  for (int rank = 0; rank < 2; ++rank) {
    fleet.addresses.push_back("127.0.0.1:" + std::to_string(FreePort()));
    ServerOptions o;
    o.listen = fleet.addresses.back();
    o.metrics_address = "";
    o.rank = rank;
    o.world = 2;
    // Every rank has its own internal address; rank 0's is the coordinator.
    o.fleet_listen = "127.0.0.1:" + std::to_string(rank == 0 ? fleet_port : FreePort());
    o.coordinator = "127.0.0.1:" + std::to_string(fleet_port);
    if (adjust) adjust(o);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(o);
    ASSERT_OK(server);
    fleet.ranks.push_back(*std::move(server));
  }
  // Both ranks in the formed generation, so that each trainer rank's first attempt is served by
  // its own fleet rank (a rank not yet formed answers UNAVAILABLE and the retry goes elsewhere).
  std::vector<std::unique_ptr<Server>>& ranks = fleet.ranks;
  for (int i = 0; i < 600 && !(ranks[0]->fleet().ready() && ranks[1]->fleet().ready() &&
                               ranks[1]->fleet().generation_size() == 2);
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(ranks[0]->fleet().ready() && ranks[1]->fleet().ready()) << "the 2-rank fleet did not form";
}

TEST(RealFleetTest, GroupClientRoutesTrainerRanksAcrossATwoRankFleet) {
  TwoRankFleet fleet;
  ASSERT_NO_FATAL_FAILURE(StartTwoRankFleet(fleet, [](ServerOptions& o) { o.service.chunk_bytes = 2048; }));
  std::vector<std::unique_ptr<Server>>& ranks = fleet.ranks;
  const std::vector<std::string>& addresses = fleet.addresses;
  GroupClient::Options options;
  options.client.address = addresses[1];  // Discover through rank 1.
  options.client.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<GroupClient>> group = GroupClient::Create(options);
  for (int i = 0; i < 100 && (!group.ok() || (*group)->member_client(0)->Health().code() != absl::StatusCode::kOk ||
                              (*group)->member_client(1)->Health().code() != absl::StatusCode::kOk);
       ++i) {
    absl::SleepFor(absl::Milliseconds(100));  // The fleet forms in the background.
    group = GroupClient::Create(options);
  }
  ASSERT_OK(group);
  ASSERT_EQ((*group)->fleet_world(), 2);
  EXPECT_EQ((*group)->member_address(0), addresses[0]);
  EXPECT_EQ((*group)->member_address(1), addresses[1]);

  const std::vector<float> g = Random(48 * 20, 6);
  ClientOptions lone_options = options.client;
  lone_options.address = addresses[0];
  absl::StatusOr<std::unique_ptr<Client>> lone = Client::Create(lone_options);
  ASSERT_OK(lone);
  MatrixInput whole = Input("w", {48, 20}, g);
  absl::StatusOr<std::vector<MatrixOutput>> reference = (*lone)->Step(StepOptions{}, {&whole, 1});
  ASSERT_OK(reference);
  ASSERT_OK((*reference)[0].status);
  const std::vector<float> expected = AsFloats((*reference)[0]);

  // W = 2 trainer ranks over S = 2: trainer rank r streams to fleet rank r.
  std::vector<absl::StatusOr<std::vector<MatrixOutput>>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> trainers;
  trainers.reserve(2);
  for (int rank = 0; rank < 2; ++rank) {
    trainers.emplace_back([&, rank] {
      MatrixInput in = Input("w", {48, 20}, g);
      in.block = Block{24 * rank, 0, 24, 20};
      in.data = g.data() + 24 * 20 * rank;
      in.bytes = 24 * 20 * sizeof(float);
      results[rank] = (*group)->Step("client-test", "fleet2", 1, rank, 2, {&in, 1});
    });
  }
  for (std::thread& t : trainers) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_OK(results[rank]);
    ASSERT_OK((*results[rank])[0].status);
    ASSERT_TRUE((*group)->member_client(rank)->last_summary().has_value());
    EXPECT_EQ((*group)->member_client(rank)->last_summary()->fleet_rank(), rank);
    const std::vector<float> got = AsFloats((*results[rank])[0]);
    ASSERT_EQ(got.size(), 24u * 20);
    double worst = 0;
    for (size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::fabs(double{got[k]} - expected[24 * 20 * rank + k]));
    EXPECT_LE(worst, 1e-5) << "rank " << rank;
  }
  for (auto& server : ranks) server->Drain();
}

TEST(RealFleetTest, APlanTooLargeForTheFleetsLogFailsItsStepAndTheNextStepRuns) {
  TwoRankFleet fleet;
  ASSERT_NO_FATAL_FAILURE(StartTwoRankFleet(fleet, [](ServerOptions& o) { o.fleet_max_log_entry_bytes = 32 << 10; }));
  GroupClient::Options options;
  options.client.address = fleet.addresses[0];
  options.client.timeout = absl::Seconds(30);
  options.client.retry.deadline = absl::Seconds(10);
  options.run_id = "too-large";
  absl::StatusOr<std::unique_ptr<GroupClient>> group = GroupClient::Create(options);
  ASSERT_OK(group);
  // Trainer rank r's row block of `count` 4 x 8 matrices.
  const std::vector<float> g = Random(4 * 8, 9);
  auto step = [&](int64_t number, int count) {
    std::vector<absl::StatusOr<std::vector<MatrixOutput>>> results(2, absl::UnknownError("not run"));
    std::vector<std::thread> trainers;
    for (int rank = 0; rank < 2; ++rank) {
      trainers.emplace_back([&, rank] {
        std::vector<MatrixInput> inputs;
        for (int i = 0; i < count; ++i) {
          MatrixInput in = Input(absl::StrCat("layers.", i, ".weight"), {4, 8}, g);
          in.block = Block{2 * rank, 0, 2, 8};
          in.data = g.data() + 2 * 8 * rank;
          in.bytes = 2 * 8 * sizeof(float);
          inputs.push_back(in);
        }
        results[rank] = (*group)->Step("client-test", "too-large", number, rank, 2, inputs);
      });
    }
    for (std::thread& t : trainers) t.join();
    return results;
  };
  // 400 matrices of 2 placements: within every ingress limit, over the 32 KiB log entry.
  for (const auto& result : step(1, 400)) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("400 matrices, 800 block placements over 2 trainer ranks")));
  }
  EXPECT_TRUE(fleet.ranks[0]->fleet().ready());
  EXPECT_TRUE(fleet.ranks[1]->fleet().ready());
  const absl::Time next = absl::Now();
  for (const auto& result : step(2, 4)) {
    ASSERT_OK(result);
    for (const MatrixOutput& out : *result) EXPECT_OK(out.status);
  }
  EXPECT_LT(absl::Now() - next, absl::Seconds(5));
  for (auto& server : fleet.ranks) server->Drain();
}

}  // namespace
}  // namespace orthoserve::client
