// Group steps on a one-rank fleet in process: W trainer streams meet, their blocks are
// orthogonalized as one matrix and each rank gets its own blocks back; ranks that disagree,
// repeat, or never come fail the step on every rank with the documented code.
#include <future>
#include <thread>

#include "common/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class GroupStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = Server::Create(TestServerOptions());
    ASSERT_OK(server);
    server_ = std::move(*server);
    stub_ = StubFor(*server_);
  }

  // Runs one rank's stream with `matrices` (spec + full matrix data), sending only its row chunk.
  StreamOutcome RunRank(int rank, int world, int64_t step, const std::vector<v1::MatrixSpec>& specs,
                        const std::vector<std::vector<float>>& full, const std::string& job = "job",
                        const std::string& run = "run-a", int attempt = 0) {
    std::vector<v1::StreamRequest> messages = {
        HeaderMessage(static_cast<int>(specs.size()), rank, world, job, step, "g", run)};
    messages[0].mutable_header()->set_attempt(attempt);
    for (size_t i = 0; i < specs.size(); ++i) {
      Matrix2d m = *ViewAs2d(std::vector<int64_t>(specs[i].shape().begin(), specs[i].shape().end()), "s");
      std::vector<int64_t> offsets = ChunkOffsets(m.rows, world);
      Block block{offsets[rank], 0, offsets[rank + 1] - offsets[rank], m.cols};
      v1::MatrixSpec spec = specs[i];
      *spec.mutable_block() = BlockToProto(block);
      std::vector<float> part(static_cast<size_t>(block.numel()));
      CopyBlockOut(full[i].data(), m.cols, block, sizeof(float), part.data());
      AppendMatrix(messages, static_cast<int>(i), spec, Bytes(part, DType::kF32), 200);
    }
    messages.push_back(EndMessage());
    return RunStream(*stub_, messages);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Orthogonalizer::Stub> stub_;
};

TEST_F(GroupStepTest, RanksGetTheirBlocksOfTheWholeMatrixResult) {
  for (int world : {2, 3}) {
    for (v1::Algorithm algorithm : {v1::ALGORITHM_AUTO, v1::ALGORITHM_ROW_SHARDED, v1::ALGORITHM_GATHERED}) {
      NsOptions options;
      options.precision = Precision::kHighest;
      std::vector<v1::MatrixSpec> specs = {Spec("a", {10, 6}, DType::kF32, options),
                                           Spec("b", {5, 12}, DType::kF32, options)};
      for (auto& s : specs) s.set_algorithm(algorithm);
      std::vector<std::vector<float>> full = {RandomMatrix(10, 6, 1), RandomMatrix(5, 12, 2)};
      std::vector<std::future<StreamOutcome>> ranks;
      for (int r = 0; r < world; ++r) {
        ranks.push_back(std::async(std::launch::async, [&, r] { return RunRank(r, world, 7, specs, full); }));
      }
      for (int r = 0; r < world; ++r) {
        StreamOutcome out = ranks[r].get();
        ASSERT_TRUE(out.status.ok()) << out.status.error_message();
        for (int i = 0; i < 2; ++i) {
          Matrix2d m = *ViewAs2d(std::vector<int64_t>(specs[i].shape().begin(), specs[i].shape().end()), "s");
          std::string expected_full = Reference(Bytes(full[i], DType::kF32), m, DType::kF32, DType::kF32, options);
          std::vector<int64_t> offsets = ChunkOffsets(m.rows, world);
          Block block{offsets[r], 0, offsets[r + 1] - offsets[r], m.cols};
          std::string expected(static_cast<size_t>(block.numel()) * 4, '\0');
          CopyBlockOut(expected_full.data(), m.cols, block, 4, expected.data());
          EXPECT_EQ(out.results[i].code(), 0) << out.results[i].message();
          EXPECT_EQ(out.data[i], expected) << "world " << world << " rank " << r << " matrix " << i;
        }
      }
    }
  }
}

TEST_F(GroupStepTest, MissingRankTimesOutWithAbortedNamingIt) {
  std::vector<v1::MatrixSpec> specs = {Spec("a", {4, 4}, DType::kF32, NsOptions())};
  std::vector<std::vector<float>> full = {RandomMatrix(4, 4, 1)};
  const absl::Time start = absl::Now();
  StreamOutcome out = RunRank(0, 3, 1, specs, full);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(out.status.error_message(), HasSubstr("trainer ranks [1, 2] of 3 did not arrive"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The next step of the same group works.
  std::vector<std::future<StreamOutcome>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] { return RunRank(r, 2, 2, specs, full); }));
  }
  for (auto& f : ranks) EXPECT_TRUE(f.get().status.ok());
}

TEST_F(GroupStepTest, SpecsThatDifferFailEveryRank) {
  NsOptions five;
  NsOptions six;
  six.steps = 6;
  std::vector<std::vector<float>> full = {RandomMatrix(4, 4, 1)};
  auto r0 = std::async(std::launch::async,
                       [&] { return RunRank(0, 2, 3, {Spec("a", {4, 4}, DType::kF32, five)}, full); });
  auto r1 = std::async(std::launch::async, [&] { return RunRank(1, 2, 3, {Spec("a", {4, 4}, DType::kF32, six)}, full); });
  for (StreamOutcome out : {r0.get(), r1.get()}) {
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(out.status.error_message(), HasSubstr("options.steps (5 vs 6)"));
  }
}

TEST_F(GroupStepTest, DuplicateRankFailsTheStep) {
  std::vector<v1::MatrixSpec> specs = {Spec("a", {4, 4}, DType::kF32, NsOptions())};
  std::vector<std::vector<float>> full = {RandomMatrix(4, 4, 1)};
  auto a = std::async(std::launch::async, [&] { return RunRank(0, 2, 4, specs, full); });
  auto b = std::async(std::launch::async, [&] { return RunRank(0, 2, 4, specs, full); });
  StreamOutcome x = a.get();
  StreamOutcome y = b.get();
  EXPECT_EQ(x.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(y.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(x.status.error_message(), HasSubstr("duplicate rank"));
}

TEST_F(GroupStepTest, BlocksThatDoNotTileFailThatMatrixInBand) {
  std::vector<v1::MatrixSpec> specs = {Spec("a", {4, 4}, DType::kF32, NsOptions())};
  auto send = [&](int rank, Block block) {
    std::vector<v1::StreamRequest> messages = {HeaderMessage(1, rank, 2, "tile", 1)};
    v1::MatrixSpec spec = specs[0];
    *spec.mutable_block() = BlockToProto(block);
    AppendMatrix(messages, 0, spec, Bytes(std::vector<float>(block.numel(), 1.0f), DType::kF32));
    messages.push_back(EndMessage());
    return RunStream(*stub_, messages);
  };
  auto r0 = std::async(std::launch::async, [&] { return send(0, Block{0, 0, 3, 4}); });
  auto r1 = std::async(std::launch::async, [&] { return send(1, Block{2, 0, 2, 4}); });
  for (StreamOutcome out : {r0.get(), r1.get()}) {
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.results[0].code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_THAT(out.results[0].message(), HasSubstr("overlaps"));
  }
}

TEST_F(GroupStepTest, CancelledTrainerAbortsTheOthers) {
  std::vector<v1::MatrixSpec> specs = {Spec("a", {6, 4}, DType::kF32, NsOptions())};
  std::vector<std::vector<float>> full = {RandomMatrix(6, 4, 1)};
  auto waiting = std::async(std::launch::async, [&] { return RunRank(0, 2, 9, specs, full); });
  // Rank 1 opens its stream, sends its header and half a spec's data, then cancels.
  grpc::ClientContext context;
  auto stream = stub_->OrthogonalizeStream(&context);
  ASSERT_TRUE(stream->Write(HeaderMessage(1, 1, 2, "job", 9)));
  v1::StreamRequest spec;
  *spec.mutable_spec() = specs[0];
  *spec.mutable_spec()->mutable_block() = BlockToProto(Block{3, 0, 3, 4});
  ASSERT_TRUE(stream->Write(spec));
  absl::SleepFor(absl::Milliseconds(300));
  context.TryCancel();
  const absl::Time cancelled = absl::Now();
  StreamOutcome out = waiting.get();
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(out.status.error_message(), HasSubstr("trainer rank 1"));
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(2));  // Well before the 3 s rendezvous timeout.
  stream->Finish();
}

}  // namespace
}  // namespace orthoserve::testing

namespace orthoserve::testing {
namespace {

// Trainer rank `rank` of 2's row block of the orthogonalized `full` (rows x cols, HIGHEST).
std::string ExpectedBlock(const std::vector<float>& full, int64_t rows, int64_t cols, int rank, const NsOptions& options) {
  const Matrix2d m{rows, cols};
  const std::string whole = Reference(Bytes(full, DType::kF32), m, DType::kF32, DType::kF32, options);
  const std::vector<int64_t> offsets = ChunkOffsets(rows, 2);
  const Block block{offsets[rank], 0, offsets[rank + 1] - offsets[rank], cols};
  std::string expected(static_cast<size_t>(block.numel()) * 4, '\0');
  CopyBlockOut(whole.data(), cols, block, 4, expected.data());
  return expected;
}

TEST_F(GroupStepTest, TwoRunsOfOneJobNeverShareAStepAndEachGetsItsOwnResultOrAClearError) {
  NsOptions options;
  options.precision = Precision::kHighest;
  const std::vector<v1::MatrixSpec> specs = {Spec("w", {16, 8}, DType::kF32, options)};
  const std::vector<std::vector<float>> a = {RandomMatrix(16, 8, 11)};
  const std::vector<std::vector<float>> b = {RandomMatrix(16, 8, 22)};
  // Interleaved: A0, then B0 while A gathers (refused), then A1 (A completes).
  auto a0 = std::async(std::launch::async, [&] { return RunRank(0, 2, 5, specs, a, "sweep", "run-a"); });
  absl::SleepFor(absl::Milliseconds(200));
  StreamOutcome b0 = RunRank(0, 2, 5, specs, b, "sweep", "run-b");
  EXPECT_EQ(b0.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(b0.status.error_message(),
              AllOf(HasSubstr("run \"run-b\""), HasSubstr("run \"run-a\""), HasSubstr("sweep/g@5")));
  StreamOutcome a1 = RunRank(1, 2, 5, specs, a, "sweep", "run-a");
  StreamOutcome a0_out = a0.get();
  ASSERT_TRUE(a0_out.status.ok()) << a0_out.status.error_message();
  ASSERT_TRUE(a1.status.ok()) << a1.status.error_message();
  EXPECT_EQ(a0_out.data[0], ExpectedBlock(a[0], 16, 8, 0, options));
  EXPECT_EQ(a1.data[0], ExpectedBlock(a[0], 16, 8, 1, options));
  // B, retrying once A is done, gathers its own step of the same number and gets B's result.
  auto b1 = std::async(std::launch::async, [&] { return RunRank(1, 2, 5, specs, b, "sweep", "run-b"); });
  StreamOutcome b0_retry = RunRank(0, 2, 5, specs, b, "sweep", "run-b", /*attempt=*/1);
  StreamOutcome b1_out = b1.get();
  ASSERT_TRUE(b0_retry.status.ok()) << b0_retry.status.error_message();
  ASSERT_TRUE(b1_out.status.ok()) << b1_out.status.error_message();
  EXPECT_EQ(b0_retry.data[0], ExpectedBlock(b[0], 16, 8, 0, options));
  EXPECT_EQ(b1_out.data[0], ExpectedBlock(b[0], 16, 8, 1, options));
}

TEST_F(GroupStepTest, ARetryOfAFinishedStepIsAnsweredFromKeptInputsOnlyWithTheSameBlocks) {
  NsOptions options;
  options.precision = Precision::kHighest;
  const std::vector<v1::MatrixSpec> specs = {Spec("w", {16, 8}, DType::kF32, options)};
  const std::vector<std::vector<float>> full = {RandomMatrix(16, 8, 5)};
  auto r1 = std::async(std::launch::async, [&] { return RunRank(1, 2, 3, specs, full); });
  StreamOutcome r0 = RunRank(0, 2, 3, specs, full);
  ASSERT_TRUE(r0.status.ok()) << r0.status.error_message();
  ASSERT_TRUE(r1.get().status.ok());
  // Rank 1 "lost" its result and retries, but with other blocks: refused, not mixed with rank 0's
  // kept ones.
  std::vector<std::vector<float>> changed = full;
  changed[0][8 * 8 + 3] += 1.0f;  // In rank 1's rows.
  // (Sent at once: the member's notice of what it keeps may reach the coordinator after the retry.)
  StreamOutcome wrong = RunRank(1, 2, 3, specs, changed, "job", "run-a", /*attempt=*/1);
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(wrong.status.error_message(), HasSubstr("with blocks other than those of the attempt that ran"));
  // With its own blocks the retry is replayed: the original result, bit for bit.
  StreamOutcome replayed = RunRank(1, 2, 3, specs, full, "job", "run-a", /*attempt=*/2);
  ASSERT_TRUE(replayed.status.ok()) << replayed.status.error_message();
  EXPECT_EQ(replayed.data[0], ExpectedBlock(full[0], 16, 8, 1, options));
}

TEST_F(GroupStepTest, AGroupStepWithoutARunIdIsRefusedUnlessTheServerAllowsIt) {
  const std::vector<v1::MatrixSpec> specs = {Spec("w", {4, 4}, DType::kF32, NsOptions())};
  const std::vector<std::vector<float>> full = {RandomMatrix(4, 4, 1)};
  StreamOutcome refused = RunRank(0, 2, 1, specs, full, "job", /*run=*/"");
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("header run_id is empty"));

  ServerOptions allowing = TestServerOptions();
  allowing.service.allow_group_steps_without_run_id = true;
  auto server = Server::Create(allowing);
  ASSERT_OK(server);
  server_ = std::move(*server);
  stub_ = StubFor(*server_);
  auto r1 = std::async(std::launch::async, [&] { return RunRank(1, 2, 1, specs, full, "job", ""); });
  StreamOutcome r0 = RunRank(0, 2, 1, specs, full, "job", "");
  EXPECT_TRUE(r0.status.ok()) << r0.status.error_message();
  EXPECT_TRUE(r1.get().status.ok());
}

}  // namespace
}  // namespace orthoserve::testing
