// ExecuteBatch beyond the algorithms: the embedded one-rank fleet on LocalCollective, owners
// chosen when the plan has none, the caller's mistakes (wrong fleet size, bad local blocks), and
// TP_DISTRIBUTED with split_qkv over row shards.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/local_collective.h"
#include "tests/unit/distributed/batch_harness.h"
#include "tests/util/rank_threads.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

MatrixSpec Spec(const std::string& name, std::vector<int64_t> shape, Algorithm algorithm, Layout layout,
                int partition_dim = 0, uint32_t seed = 1) {
  MatrixSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.algorithm = algorithm;
  spec.layout = layout;
  spec.partition_dim = partition_dim;
  spec.options.precision = Precision::kHighest;
  spec.seed = seed;
  return spec;
}

bool SameBytes(const std::vector<char>& a, const std::vector<char>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

TEST(ExecuteTest, OneRankFleetOnLocalCollective) {
  // The embedded default: S = 1 with no transport, trainer groups of 1 and 3.
  for (int w : {1, 3}) {
    std::vector<MatrixSpec> specs = {
        Spec("a", {9, 6}, Algorithm::kAuto, Layout::kGrid, 0, 1),
        Spec("r", {9, 6}, Algorithm::kRowSharded, Layout::kRows, 0, 1),
        Spec("g", {9, 6}, Algorithm::kGathered, Layout::kReversedRows, 0, 1),
        Spec("d", {9, 6}, Algorithm::kTpDuplicated, Layout::kCols, 1, 1),
        Spec("t", {9, 6}, Algorithm::kTpDistributed, Layout::kRows, 0, 1),
        Spec("b", {9, 6}, Algorithm::kTpBlockwise, Layout::kRows, 0, 1),
    };
    specs[1].options.precision = specs[2].options.precision = Precision::kMedium;
    specs[3].dtype = specs[3].result_dtype = DType::kBF16;
    const BatchPlan plan = MakePlan(w, 1, specs);
    BatchData data = MakeData(plan, specs);
    LocalCollective local;
    std::vector<LocalBlock> blocks = LocalBlocksOf(plan, data, 0);
    absl::StatusOr<BatchResult> result = ExecuteBatch(plan, blocks, SharedCpuBackend(), local, ExecuteOptions());
    ASSERT_OK(result);
    for (const absl::Status& s : result->matrices) EXPECT_OK(s);
    EXPECT_GT(result->flops, 0);
    EXPECT_GT(result->compute_time, absl::ZeroDuration());
    for (int m : {0, 1, 2, 3}) {
      EXPECT_TRUE(
          SameBytes(AssembleResult(plan, data, m), WholeReference(SharedCpuBackend(), plan.matrices[m], data.whole[m])))
          << specs[m].name << " W " << w;
    }
    EXPECT_LE(
        RelativeFrobenius(ToF32(DType::kF32, AssembleResult(plan, data, 4)),
                          ToF32(DType::kF32, WholeReference(SharedCpuBackend(), plan.matrices[4], data.whole[4]))),
        1e-5);
    EXPECT_TRUE(SameBytes(AssembleResult(plan, data, 5),
                          BlockwiseReference(SharedCpuBackend(), plan.matrices[5], data.whole[5])));
  }
}

TEST(ExecuteTest, ChoosesOwnersWhenThePlanHasNone) {
  std::vector<MatrixSpec> specs;
  specs.reserve(4);
  for (int i = 0; i < 4; ++i) {
    specs.push_back(Spec("m" + std::to_string(i), {6 + 2 * i, 8}, Algorithm::kAuto, Layout::kGrid, 0, 20 + i));
  }
  BatchPlan plan = MakePlan(4, 2, specs);
  for (MatrixPlan& m : plan.matrices) m.owner = -1;
  BatchData data = MakeData(plan, specs);
  std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&SharedCpuBackend()});
  ASSERT_EQ(results.size(), 2u);
  double flops[2] = {0, 0};
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_OK(results[rank]);
    for (const absl::Status& s : results[rank]->matrices) EXPECT_OK(s);
    flops[rank] = results[rank]->flops;
  }
  // Both ranks computed (the owners were spread), and every result is exact.
  EXPECT_GT(flops[0], 0);
  EXPECT_GT(flops[1], 0);
  for (int m = 0; m < 4; ++m) {
    EXPECT_TRUE(
        SameBytes(AssembleResult(plan, data, m), WholeReference(SharedCpuBackend(), plan.matrices[m], data.whole[m])));
  }
}

TEST(ExecuteTest, LoneTrainerOnAnyFleetRank) {
  // W = 1 streaming to the last of 3 fleet ranks: every algorithm still gives its result there.
  std::vector<MatrixSpec> specs = {
      Spec("a", {9, 6}, Algorithm::kAuto, Layout::kRows, 0, 4),
      Spec("r", {9, 6}, Algorithm::kRowSharded, Layout::kRows, 0, 4),
      Spec("g", {9, 6}, Algorithm::kGathered, Layout::kRows, 0, 4),
      Spec("d", {9, 6}, Algorithm::kTpDuplicated, Layout::kRows, 0, 4),
      Spec("t", {9, 6}, Algorithm::kTpDistributed, Layout::kCols, 1, 4),
      Spec("b", {9, 6}, Algorithm::kTpBlockwise, Layout::kRows, 0, 4),
  };
  BatchPlan plan = MakePlan(1, 3, specs);
  for (MatrixPlan& m : plan.matrices) m.blocks[0].fleet_rank = 2;
  AssignOwners(plan);
  BatchData data = MakeData(plan, specs);
  std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&SharedCpuBackend()});
  ASSERT_EQ(results.size(), 3u);
  for (const absl::StatusOr<BatchResult>& r : results) {
    ASSERT_OK(r);
    for (const absl::Status& st : r->matrices) EXPECT_OK(st);
  }
  for (int m = 0; m < 6; ++m) {
    const std::vector<char> got = AssembleResult(plan, data, m);
    const std::vector<char> want = WholeReference(SharedCpuBackend(), plan.matrices[m], data.whole[m]);
    if (m == 4) {
      EXPECT_LE(RelativeFrobenius(ToF32(DType::kF32, got), ToF32(DType::kF32, want)), 1e-5);
    } else {
      EXPECT_TRUE(SameBytes(got, want)) << specs[m].name;  // Blockwise of one whole block is whole NS.
    }
  }
}

TEST(ExecuteTest, RejectsACollectiveOfAnotherFleetSize) {
  const std::vector<MatrixSpec> specs = {Spec("a", {4, 4}, Algorithm::kAuto, Layout::kRows)};
  const BatchPlan plan = MakePlan(2, 2, specs);
  BatchData data = MakeData(plan, specs);
  LocalCollective local;
  std::vector<LocalBlock> blocks = LocalBlocksOf(plan, data, 0);
  EXPECT_THAT(ExecuteBatch(plan, blocks, SharedCpuBackend(), local, ExecuteOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("fleet of 2"), HasSubstr("has 1"))));
}

TEST(ExecuteTest, BadLocalBlocksFailTheirMatrixOnly) {
  const std::vector<MatrixSpec> specs = {
      Spec("dup", {4, 6}, Algorithm::kAuto, Layout::kRows),
      Spec("null", {4, 6}, Algorithm::kGathered, Layout::kRows),
      Spec("foreign", {4, 6}, Algorithm::kTpBlockwise, Layout::kRows),
      Spec("fine", {4, 6}, Algorithm::kAuto, Layout::kGrid),
  };
  const BatchPlan plan = MakePlan(2, 1, specs);
  BatchData data = MakeData(plan, specs);
  std::vector<LocalBlock> blocks = LocalBlocksOf(plan, data, 0);
  for (LocalBlock& b : blocks) {
    if (b.matrix == 1 && b.trainer_rank == 1) b.in = nullptr;
  }
  blocks.push_back(LocalBlock{0, 0, data.in[0][0].data(), data.out[0][0].data()});
  blocks.push_back(LocalBlock{2, 5, data.in[2][0].data(), data.out[2][0].data()});
  LocalCollective local;
  absl::StatusOr<BatchResult> result = ExecuteBatch(plan, blocks, SharedCpuBackend(), local, ExecuteOptions());
  ASSERT_OK(result);
  EXPECT_THAT(result->matrices[0], StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("matrix \"dup\""), HasSubstr("two local blocks"))));
  EXPECT_THAT(result->matrices[1], StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("matrix \"null\""), HasSubstr("no input or output"))));
  EXPECT_THAT(result->matrices[2], StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("matrix \"foreign\""), HasSubstr("trainer rank 5"))));
  EXPECT_OK(result->matrices[3]);
  EXPECT_TRUE(
      SameBytes(AssembleResult(plan, data, 3), WholeReference(SharedCpuBackend(), plan.matrices[3], data.whole[3])));

  // A block for a matrix the plan does not have cannot be attributed: every matrix fails.
  blocks = LocalBlocksOf(plan, data, 0);
  blocks.push_back(LocalBlock{9, 0, data.in[0][0].data(), data.out[0][0].data()});
  result = ExecuteBatch(plan, blocks, SharedCpuBackend(), local, ExecuteOptions());
  ASSERT_OK(result);
  for (const absl::Status& s : result->matrices) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix index 9")));
  }
}

// Forwards to another Collective and records the bytes each AllToAllv call sends to other ranks
// and receives from them.
class RecordingCollective final : public Collective {
 public:
  explicit RecordingCollective(Collective& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world() const override { return inner_.world(); }
  std::string name() const override { return inner_.name(); }
  absl::Status AllToAllv(const void* s, absl::Span<const size_t> sb, void* r, absl::Span<const size_t> rb,
                         absl::Duration t) override {
    size_t sent = 0, received = 0;
    for (int p = 0; p < world(); ++p) {
      if (p == rank()) continue;
      sent += sb[p];
      received += rb[p];
    }
    all_to_allv.push_back({sent, received});
    return inner_.AllToAllv(s, sb, r, rb, t);
  }
  absl::Status AllGatherv(const void* s, size_t sb, void* r, absl::Span<const size_t> rb, absl::Duration t) override {
    return inner_.AllGatherv(s, sb, r, rb, t);
  }
  absl::Status AllReduceSum(absl::Span<float> v, absl::Duration t) override { return inner_.AllReduceSum(v, t); }
  absl::Status AllReduceSum(absl::Span<double> v, absl::Duration t) override { return inner_.AllReduceSum(v, t); }
  absl::Status Broadcast(void* d, size_t b, int root, absl::Duration t) override {
    return inner_.Broadcast(d, b, root, t);
  }
  absl::Status Barrier(absl::Duration t) override { return inner_.Barrier(t); }
  void Abort(absl::string_view reason) override { inner_.Abort(reason); }

  std::vector<std::pair<size_t, size_t>> all_to_allv;  // (sent, received) per call.

 private:
  Collective& inner_;
};

TEST(ExecuteTest, BlocksTravelInTheirDtypeAndResultsInTheResultDtype) {
  // A bf16 16x24 matrix in two row blocks on two fleet ranks, fp32 results: the rank that does
  // not own it sends its 8x24 block as bf16 (2 bytes each) and gets fp32 back (4 bytes each).
  MatrixSpec spec = Spec("w", {16, 24}, Algorithm::kAuto, Layout::kRows, 0, 3);
  spec.dtype = DType::kBF16;
  const BatchPlan plan = MakePlan(2, 2, {spec});
  BatchData data = MakeData(plan, {spec});
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(2);
  ASSERT_OK(group);
  std::vector<std::unique_ptr<RecordingCollective>> recording;
  for (int r = 0; r < 2; ++r) recording.push_back(std::make_unique<RecordingCollective>(*(*group)[r]));
  std::vector<absl::StatusOr<BatchResult>> results(2, absl::UnknownError("not run"));
  RunRanks(2, [&](int rank) {
    std::vector<LocalBlock> local = LocalBlocksOf(plan, data, rank);
    results[rank] = ExecuteBatch(plan, local, SharedCpuBackend(), *recording[rank], ExecuteOptions());
  });
  const int owner = plan.matrices[0].owner;
  const int other = 1 - owner;
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK(results[r]);
    EXPECT_OK(results[r]->matrices[0]);
  }
  const size_t block = 8 * 24;
  ASSERT_EQ(recording[other]->all_to_allv.size(), 2u);
  EXPECT_EQ(recording[other]->all_to_allv[0], std::make_pair(block * 2, size_t{0}));
  EXPECT_EQ(recording[other]->all_to_allv[1], std::make_pair(size_t{0}, block * 4));
  ASSERT_EQ(recording[owner]->all_to_allv.size(), 2u);
  EXPECT_EQ(recording[owner]->all_to_allv[0], std::make_pair(size_t{0}, block * 2));
  EXPECT_EQ(recording[owner]->all_to_allv[1], std::make_pair(block * 4, size_t{0}));
  EXPECT_TRUE(
      SameBytes(AssembleResult(plan, data, 0), WholeReference(SharedCpuBackend(), plan.matrices[0], data.whole[0])));
}

TEST(ExecuteTest, RowShardedRoundsFollowTheSeed) {
  // Grouped by dtype in order of first appearance (bf16 "d", then fp32), numel descending within
  // a group, rounds of S = 2 with rank i owning the i-th: bf16 round 0 = [d]; fp32 round 0 =
  // [b, c], round 1 = [a]. So rank 0 computes d, b and a; rank 1 computes c.
  std::vector<MatrixSpec> specs = {
      Spec("d", {6, 4}, Algorithm::kRowSharded, Layout::kRows, 0, 1),
      Spec("a", {4, 4}, Algorithm::kRowSharded, Layout::kRows, 0, 2),
      Spec("b", {8, 8}, Algorithm::kRowSharded, Layout::kRows, 0, 3),
      Spec("c", {6, 6}, Algorithm::kRowSharded, Layout::kRows, 0, 4),
  };
  specs[0].dtype = DType::kBF16;
  const BatchPlan plan = MakePlan(2, 2, specs);
  BatchData data = MakeData(plan, specs);
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(2);
  ASSERT_OK(group);
  std::vector<std::unique_ptr<RecordingCollective>> recording;
  for (int r = 0; r < 2; ++r) recording.push_back(std::make_unique<RecordingCollective>(*(*group)[r]));
  std::vector<absl::StatusOr<BatchResult>> results(2, absl::UnknownError("not run"));
  RunRanks(2, [&](int rank) {
    std::vector<LocalBlock> local = LocalBlocksOf(plan, data, rank);
    results[rank] = ExecuteBatch(plan, local, SharedCpuBackend(), *recording[rank], ExecuteOptions());
  });
  auto flops = [&](int m) { return NsFlops(plan.matrices[m].view.rows, plan.matrices[m].view.cols, specs[m].options); };
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK(results[r]);
    for (const absl::Status& st : results[r]->matrices) EXPECT_OK(st);
    EXPECT_EQ(recording[r]->all_to_allv.size(), 6u) << "two all-to-allv per round, three rounds";
  }
  EXPECT_DOUBLE_EQ(results[0]->flops, flops(0) + flops(2) + flops(1));
  EXPECT_DOUBLE_EQ(results[1]->flops, flops(3));
  // Round 0 of fp32 (the second round overall): rank 1 receives rank 0's 3-row half of "c".
  EXPECT_EQ(recording[1]->all_to_allv[2], std::make_pair(size_t{4 * 8 * 4}, size_t{3 * 6 * 4}));
  for (int m = 0; m < 4; ++m) {
    EXPECT_TRUE(
        SameBytes(AssembleResult(plan, data, m), WholeReference(SharedCpuBackend(), plan.matrices[m], data.whole[m])))
        << specs[m].name;
  }
}

TEST(ExecuteTest, TpDistributedSplitQkvOverRowShards) {
  // 4 query groups of q+k+v = 2+1+1 rows; 4 trainer row shards keep whole groups.
  for (int s : {1, 2, 3}) {
    MatrixSpec qkv = Spec("qkv", {16, 6}, Algorithm::kTpDistributed, Layout::kRows, 0, 9);
    qkv.options.split_qkv = {2, 1, 1};
    MatrixSpec medium = qkv;
    medium.name = "qkv_medium";
    medium.options.precision = Precision::kMedium;
    const std::vector<MatrixSpec> specs = {qkv, medium};
    const BatchPlan plan = MakePlan(4, s, specs);
    BatchData data = MakeData(plan, specs);
    std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&SharedCpuBackend()});
    ASSERT_EQ(results.size(), static_cast<size_t>(s));
    for (const absl::StatusOr<BatchResult>& r : results) {
      ASSERT_OK(r);
      for (const absl::Status& st : r->matrices) EXPECT_OK(st);
    }
    for (int m = 0; m < 2; ++m) {
      const double error =
          RelativeFrobenius(ToF32(DType::kF32, AssembleResult(plan, data, m)),
                            ToF32(DType::kF32, WholeReference(SharedCpuBackend(), plan.matrices[m], data.whole[m])));
      EXPECT_LE(error, m == 0 ? 1e-5 : 2e-2) << specs[m].name << " S " << s;
    }
  }
}

}  // namespace
}  // namespace orthoserve::testing
