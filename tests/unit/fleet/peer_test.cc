// The Peer service end to end in process on 127.0.0.1:0: a forwarded matrix is computed as this
// rank would compute it (the same bits), a request the member must not take is refused before it
// is queued (a plan that does not decode, too many elements, data that is not the whole
// matrix), and options the engine rejects fail the matrix in-band. A member that leaves the
// generation without a goodbye has the matrices forwarded to it cancelled at once.
#include "server/fleet/wire/peer.h"

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/convert/grpc_status.h"
#include "server/distributed/local_batch.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/fleet/wire/fleet_client.h"
#include "server/fleet/wire/plan_codec.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

class PeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CpuBackend::Create({});
    ASSERT_OK(backend);
    backend_ = *std::move(backend);
    pool_ = std::make_unique<FairPool>(1);
    service_ = std::make_unique<PeerService>(backend_.get(), pool_.get(), nullptr);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    target_ = "127.0.0.1:" + std::to_string(port);
    stub_ = fleet::v1::Peer::NewStub(MakeFleetChannel(target_).value());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    pool_.reset();
  }

  // Through PeerClient, as a forwarding rank sends it.
  absl::StatusOr<PeerResult> Forward(const PeerMatrix& matrix) {
    PeerClient client(absl::Seconds(30));
    std::promise<absl::StatusOr<PeerResult>> done;
    client.Compute(target_, /*rank=*/1, matrix, [&](absl::StatusOr<PeerResult> r) { done.set_value(std::move(r)); });
    return done.get_future().get();
  }

  // A request as it is, on the wire: the call's status, and the response.
  absl::Status Call(const fleet::v1::ComputeRequest& request, fleet::v1::ComputeResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return FromGrpcStatus(stub_->Compute(&context, request, response));
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<FairPool> pool_;
  std::unique_ptr<PeerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::unique_ptr<fleet::v1::Peer::Stub> stub_;
};

MatrixPlan Plan(int64_t rows, int64_t cols) {
  MatrixPlan m;
  m.name = "w";
  m.shape = {rows, cols};
  m.view = Matrix2d{rows, cols};
  return m;
}

std::string Floats(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 101) / 50.0f - 1.0f;
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

TEST_F(PeerTest, AForwardedMatrixIsComputedAsThisRankWouldComputeIt) {
  MatrixPlan plan = Plan(12, 8);
  plan.options.steps = 4;
  const std::string in = Floats(plan.view.numel());
  absl::StatusOr<PeerResult> result =
      Forward(PeerMatrix{"tenant", "job", plan, WholeBlock(plan.view), absl::string_view(in)});
  ASSERT_OK(result);
  ASSERT_OK(result->status);
  std::string here(in.size(), '\0');
  absl::StatusOr<BatchResult> local =
      RunLocalBatch({LocalMatrix{plan, WholeBlock(plan.view), in.data(), here.data()}}, *backend_);
  ASSERT_OK(local);
  ASSERT_OK(local->matrices[0]);
  EXPECT_EQ(result->data, here);
}

TEST_F(PeerTest, ARequestOverTheElementLimitIsRefusedBeforeItIsQueued) {
  fleet::v1::ComputeRequest request;
  *request.mutable_plan() = MatrixPlanToProto(Plan(int64_t{1} << 16, (int64_t{1} << 15) + 1));  // Just over 2^31.
  fleet::v1::ComputeResponse response;
  EXPECT_THAT(Call(request, &response),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("a peer computes at most 2147483648")));
}

TEST_F(PeerTest, DataThatIsNotTheWholeMatrixIsRefused) {
  const MatrixPlan plan = Plan(4, 6);
  const std::string in = Floats(12);  // Half of it.
  fleet::v1::ComputeRequest request;
  *request.mutable_plan() = MatrixPlanToProto(plan);
  request.set_data(in);
  fleet::v1::ComputeResponse response;
  EXPECT_THAT(Call(request, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 48 bytes; its plan needs 96")));
  // A lone client's block that is not the whole matrix: the call fails, and the forwarding rank
  // computes it itself (where ValidatePlan fails it in-band).
  EXPECT_THAT(Forward(PeerMatrix{"t", "j", plan, Block{0, 0, 2, 6}, absl::string_view(in)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("its plan needs 96")));
}

TEST_F(PeerTest, APlanThatDoesNotDecodeIsRefused) {
  fleet::v1::ComputeRequest request;
  *request.mutable_plan() = MatrixPlanToProto(Plan(4, 6));
  request.mutable_plan()->set_dtype(static_cast<v1::DType>(42));
  fleet::v1::ComputeResponse response;
  EXPECT_THAT(Call(request, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 0 (\"w\") dtype = 42")));
  // No plan at all (a rank of another version): it has no shape.
  request.clear_plan();
  EXPECT_THAT(Call(request, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 0 (\"\") shape [] has 0 dims")));
}

TEST_F(PeerTest, OptionsTheEngineRejectsFailTheMatrixInBand) {
  // Decoding takes any option values; the batch's validation fails the matrix.
  MatrixPlan plan = Plan(4, 6);
  plan.options.steps = 1000;
  const std::string in = Floats(24);
  absl::StatusOr<PeerResult> result = Forward(PeerMatrix{"t", "j", plan, WholeBlock(plan.view), absl::string_view(in)});
  ASSERT_OK(result);
  EXPECT_THAT(result->status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps")));
  EXPECT_TRUE(result->data.empty());
}

TEST_F(PeerTest, ForwardsToARankThatIsLostAreCancelledAtOnceAndNewOnesRefusedUntilItIsBack) {
  // The member's one compute thread is held: a forwarded matrix waits there, as on a stopped rank.
  absl::Notification release;
  pool_->Schedule([&release] { release.WaitForNotificationWithTimeout(absl::Seconds(60)); });
  const MatrixPlan plan = Plan(4, 4);
  const std::string in = Floats(plan.view.numel());
  const PeerMatrix matrix{"tenant", "job", plan, WholeBlock(plan.view), absl::string_view(in)};
  PeerClient client(absl::Seconds(60));  // The collective timeout: far longer than the test waits.
  auto forward = [&] {
    auto done = std::make_shared<std::promise<absl::StatusOr<PeerResult>>>();
    client.Compute(target_, /*rank=*/1, matrix, [done](absl::StatusOr<PeerResult> r) { done->set_value(std::move(r)); });
    return done->get_future();
  };
  auto wait_in_flight = [&](size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (client.in_flight() != n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    return client.in_flight() == n;
  };
  const Member zero{0, "rank0", 1, 0}, one{1, "rank1", 2, 0}, two{2, "rank2", 3, 0};
  client.Generation({zero, one, two}, /*graceful=*/true);
  std::future<absl::StatusOr<PeerResult>> first = forward();
  ASSERT_TRUE(wait_in_flight(1));

  // A graceful change (rank 1 leaves after its work) cancels nothing.
  client.Generation({zero, two}, /*graceful=*/true);
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);

  // Rank 1 is lost: its forward ends now, long before its deadline.
  const absl::Time lost = absl::Now();
  client.Generation({zero}, /*graceful=*/false);
  ASSERT_EQ(first.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_LT(absl::Now() - lost, absl::Seconds(5));
  EXPECT_THAT(first.get(), StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  EXPECT_TRUE(wait_in_flight(0));

  // A forward picked from the old generation fails at once, without a call.
  std::future<absl::StatusOr<PeerResult>> refused = forward();
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  EXPECT_THAT(refused.get(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fleet rank 1 left")));
  EXPECT_EQ(client.in_flight(), 0u);

  // A generation that lists rank 1 again takes it back: the next forward is computed there.
  client.Generation({zero, one}, /*graceful=*/true);
  std::future<absl::StatusOr<PeerResult>> back = forward();
  ASSERT_TRUE(wait_in_flight(1));
  release.Notify();
  ASSERT_EQ(back.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  absl::StatusOr<PeerResult> result = back.get();
  ASSERT_OK(result);
  EXPECT_OK(result->status);
}

}  // namespace
}  // namespace orthoserve
