// ValidatePlan and ParseAlgorithm: each error with its code, the matrix and the field named.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/distributed/batch_harness.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

MatrixSpec Spec(const std::string& name, std::vector<int64_t> shape, Algorithm algorithm, Layout layout,
                int partition_dim = 0) {
  MatrixSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.algorithm = algorithm;
  spec.layout = layout;
  spec.partition_dim = partition_dim;
  return spec;
}

absl::Status ValidateOne(const BatchPlan& plan) {
  std::vector<absl::Status> statuses = ValidatePlan(plan);
  EXPECT_EQ(statuses.size(), 1u);
  return statuses.empty() ? absl::UnknownError("no status") : statuses[0];
}

TEST(AlgorithmTest, NamesRoundTrip) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRowSharded, Algorithm::kGathered, Algorithm::kTpDuplicated,
                      Algorithm::kTpDistributed, Algorithm::kTpBlockwise}) {
    Algorithm parsed = Algorithm::kAuto;
    ASSERT_OK(ParseAlgorithm(AlgorithmName(a), &parsed));
    EXPECT_EQ(parsed, a);
  }
  EXPECT_EQ(AlgorithmName(Algorithm::kRowSharded), "row_sharded");
  Algorithm parsed = Algorithm::kAuto;
  EXPECT_THAT(ParseAlgorithm("rowsharded", &parsed),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("rowsharded"), HasSubstr("tp_blockwise"))));
}

TEST(PlanValidationTest, ValidPlansPassForEveryAlgorithmAndWorld) {
  for (int w : {1, 2, 3, 5}) {
    for (int s : {1, 2, 4}) {
      const BatchPlan plan = MakePlan(
          w, s,
          {Spec("a", {5, 7}, Algorithm::kAuto, Layout::kGrid), Spec("r", {5, 7}, Algorithm::kRowSharded, Layout::kRows),
           Spec("g", {6, 4, 3}, Algorithm::kGathered, Layout::kReversedRows),
           Spec("d", {5, 7}, Algorithm::kTpDuplicated, Layout::kCols, 1),
           Spec("t", {2, 9}, Algorithm::kTpDistributed, Layout::kRows, 0),
           Spec("b", {5, 7}, Algorithm::kTpBlockwise, Layout::kWholeOnLast)});
      for (const absl::Status& status : ValidatePlan(plan))
        EXPECT_TRUE(status.ok()) << "W " << w << " S " << s << ": " << status;
    }
  }
}

TEST(PlanValidationTest, OverlapAndGapNameTheMatrix) {
  BatchPlan plan = MakePlan(2, 1, {Spec("w1", {4, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].blocks[1].block.row_offset = 1;  // Rows [1, 3) overlap rank 0's [0, 2).
  plan.matrices[0].blocks[1].block.rows = 2;
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w1\" blocks"), HasSubstr("overlaps"))));
  plan.matrices[0].blocks[1].block.row_offset = 2;
  plan.matrices[0].blocks[1].block.rows = 1;  // Row 3 is left uncovered.
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w1\" blocks"), HasSubstr("no gap"))));
  plan.matrices[0].blocks[1].block.rows = 3;  // Past the end.
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w1\" blocks"), HasSubstr("inside"))));
}

// The tiling check is CheckTiling's, verdict and message, however the blocks lie: ValidatePlan
// runs a sweep instead of CheckTiling's comparison of every pair and asks CheckTiling only for
// the message of a plan that fails (plan_validation.cc, TilesExactly).
BatchPlan GatheredPlan(Matrix2d view, const std::vector<Block>& blocks) {
  BatchPlan plan;
  plan.trainer_world = static_cast<int>(blocks.size());
  plan.fleet_world = 1;
  MatrixPlan m;
  m.name = "w";
  m.shape = {view.rows, view.cols};
  m.view = view;
  m.algorithm = Algorithm::kGathered;  // No layout of its own to check after the tiling.
  for (size_t r = 0; r < blocks.size(); ++r) m.blocks.push_back(BlockPlacement{static_cast<int>(r), 0, blocks[r]});
  plan.matrices.push_back(std::move(m));
  return plan;
}

TEST(PlanValidationTest, TilingVerdictsAndMessagesAreCheckTilings) {
  std::mt19937 rng(20261201);
  auto below = [&](int64_t n) { return n <= 0 ? int64_t{0} : static_cast<int64_t>(rng() % n); };
  int tiled = 0, failed = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const Matrix2d m{1 + below(9), 1 + below(9)};
    // An exact tiling by guillotine cuts, in random order, with some empty blocks.
    std::vector<Block> blocks = {WholeBlock(m)};
    for (int64_t cuts = below(10); cuts > 0; --cuts) {
      const size_t i = static_cast<size_t>(below(static_cast<int64_t>(blocks.size())));
      const Block b = blocks[i];
      if (below(2) == 0 && b.rows > 1) {
        const int64_t k = 1 + below(b.rows - 1);
        blocks[i].rows = k;
        blocks.push_back(Block{b.row_offset + k, b.col_offset, b.rows - k, b.cols});
      } else if (b.cols > 1) {
        const int64_t k = 1 + below(b.cols - 1);
        blocks[i].cols = k;
        blocks.push_back(Block{b.row_offset, b.col_offset + k, b.rows, b.cols - k});
      }
    }
    for (int64_t e = below(3); e > 0; --e) blocks.push_back(Block{below(m.rows), below(m.cols), 0, below(3)});
    std::shuffle(blocks.begin(), blocks.end(), rng);
    // Two times in three, break it: move, grow or shrink a block, push it out, copy or drop one.
    if (below(3) != 0) {
      Block& b = blocks[below(static_cast<int64_t>(blocks.size()))];
      const int64_t d = below(2) == 0 ? -1 : 1;
      switch (below(6)) {
        case 0:
          b.row_offset += d;
          break;
        case 1:
          b.col_offset += d;
          break;
        case 2:
          b.rows += d;
          break;
        case 3:
          b.cols += d;
          break;
        case 4:
          blocks.push_back(blocks[below(static_cast<int64_t>(blocks.size()))]);
          break;
        default:
          if (blocks.size() > 1) blocks.erase(blocks.begin() + below(static_cast<int64_t>(blocks.size())));
          break;
      }
    }
    const absl::Status expected = CheckTiling(m, blocks, "matrix \"w\" blocks");
    EXPECT_EQ(ValidateOne(GatheredPlan(m, blocks)), expected) << m.rows << "x" << m.cols << " trial " << trial;
    (expected.ok() ? tiled : failed) += 1;
  }
  // Both kinds were exercised.
  EXPECT_GT(tiled, 500);
  EXPECT_GT(failed, 500);
}

TEST(PlanValidationTest, TilingAtTrainingScaleKeepsCheckTilingsMessages) {
  // 4096 row shards of a 28672 × 8192 matrix (FSDP), and a 64 × 64 grid of tiles.
  const Matrix2d m{28672, 8192};
  for (Layout layout : {Layout::kRows, Layout::kGrid, Layout::kReversedRows}) {
    std::vector<Block> blocks = MakeBlocks(m, 4096, layout);
    EXPECT_OK(ValidateOne(GatheredPlan(m, blocks)));
    // Two blocks far apart in trainer order overlap; one row is left uncovered.
    std::vector<Block> overlapping = blocks;
    overlapping[4000].rows += 1;
    const absl::Status overlap = CheckTiling(m, overlapping, "matrix \"w\" blocks");
    EXPECT_THAT(overlap, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps")));
    EXPECT_EQ(ValidateOne(GatheredPlan(m, overlapping)), overlap);
    std::vector<Block> gap = blocks;
    gap[17].rows -= 1;
    const absl::Status uncovered = CheckTiling(m, gap, "matrix \"w\" blocks");
    EXPECT_THAT(uncovered, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no gap")));
    EXPECT_EQ(ValidateOne(GatheredPlan(m, gap)), uncovered);
  }
}

TEST(PlanValidationTest, RowShardedWrongRowCountNamesRankWorldShapeAndExpected) {
  // 5 rows over 2 ranks: torch.chunk gives 3 and 2; a 2/3 split is not Shard(0).
  BatchPlan plan = MakePlan(2, 2, {Spec("w", {5, 7}, Algorithm::kRowSharded, Layout::kRows)});
  plan.matrices[0].blocks[0].block = Block{0, 0, 2, 7};
  plan.matrices[0].blocks[1].block = Block{2, 0, 3, 7};
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w\""),
                                                HasSubstr("rank 0 of 2 holds 2 rows of a (5, 7) matrix, expected 3"))));
  // N-d shapes are named as sent.
  BatchPlan nd = MakePlan(3, 1, {Spec("conv", {6, 4, 3}, Algorithm::kRowSharded, Layout::kGrid)});
  nd.matrices[0].blocks = MakeMatrixPlan(Spec("conv", {6, 4, 3}, Algorithm::kRowSharded, Layout::kRows), 3, 1).blocks;
  nd.matrices[0].blocks[1].block = Block{2, 0, 1, 12};
  nd.matrices[0].blocks[2].block = Block{3, 0, 3, 12};
  EXPECT_THAT(ValidateOne(nd), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("rank 1 of 3 holds 1 rows of a (6, 4, 3) matrix, expected 2")));
}

TEST(PlanValidationTest, RowShardedRejectsOtherLayoutsWithTheRightCounts) {
  // Column shards: each rank holds all 4 rows? No: W = 2 of a 4x6 matrix expects 2 rows each.
  BatchPlan cols = MakePlan(2, 1, {Spec("w", {4, 6}, Algorithm::kRowSharded, Layout::kCols)});
  EXPECT_THAT(ValidateOne(cols), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("rank 0 of 2 holds 4 rows of a (4, 6) matrix, expected 2")));
  // Right counts, swapped order.
  BatchPlan reversed = MakePlan(2, 1, {Spec("w", {4, 6}, Algorithm::kRowSharded, Layout::kReversedRows)});
  EXPECT_THAT(ValidateOne(reversed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 0 of 2 holds rows [2, 4)"),
                             HasSubstr("expected its torch.chunk row shard"), HasSubstr("rows [0, 2)"))));
}

TEST(PlanValidationTest, RowShardedAcceptsEmptyTrailingShards) {
  // 2 rows over 4 ranks: chunks 1, 1, 0, 0.
  const BatchPlan plan = MakePlan(4, 2, {Spec("w", {2, 9}, Algorithm::kRowSharded, Layout::kRows)});
  EXPECT_OK(ValidateOne(plan));
}

TEST(PlanValidationTest, TpModesNeedPartitionDimZeroOrOne) {
  for (Algorithm a : {Algorithm::kTpDuplicated, Algorithm::kTpDistributed}) {
    BatchPlan plan = MakePlan(2, 1, {Spec("qkv", {4, 6}, a, Layout::kRows, 0)});
    plan.matrices[0].partition_dim = 2;
    EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("matrix \"qkv\" partition_dim"), HasSubstr("0 or 1"))));
  }
  // Other algorithms ignore it.
  BatchPlan plan = MakePlan(2, 1, {Spec("w", {4, 6}, Algorithm::kGathered, Layout::kRows)});
  plan.matrices[0].partition_dim = 7;
  EXPECT_OK(ValidateOne(plan));
}

TEST(PlanValidationTest, TpLayoutMustBeChunksAlongThePartitionDim) {
  // Row shards declared as partition_dim 1.
  BatchPlan plan = MakePlan(2, 1, {Spec("w", {4, 6}, Algorithm::kTpDistributed, Layout::kRows, 1)});
  EXPECT_THAT(ValidateOne(plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("matrix \"w\" tp_distributed blocks (partition_dim 1)"),
                             HasSubstr("trainer rank 0 of 2 holds rows [0, 2) x cols [0, 6)"),
                             HasSubstr("expected its torch.chunk shard rows [0, 4) x cols [0, 3)"))));
  BatchPlan grid = MakePlan(4, 2, {Spec("w", {4, 6}, Algorithm::kTpDuplicated, Layout::kGrid, 0)});
  EXPECT_THAT(ValidateOne(grid), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("matrix \"w\" tp_duplicated blocks (partition_dim 0)")));
}

TEST(PlanValidationTest, PlacementsMustMatchTheTrainerGroupAndFleet) {
  BatchPlan plan = MakePlan(4, 2, {Spec("w", {8, 6}, Algorithm::kAuto, Layout::kRows)});
  // Trainer 1 of 4 prefers fleet rank 0 of 2, but a retry may have gone to any member.
  plan.matrices[0].blocks[1].fleet_rank = 1;
  EXPECT_OK(ValidateOne(plan));
  // A lone trainer may stream to any fleet rank too, but to one that exists.
  plan = MakePlan(1, 3, {Spec("w", {8, 6}, Algorithm::kRowSharded, Layout::kRows)});
  plan.matrices[0].blocks[0].fleet_rank = 2;
  EXPECT_OK(ValidateOne(plan));
  plan.matrices[0].blocks[0].fleet_rank = 3;
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w\" blocks"),
                                                HasSubstr("trainer rank 0 of 1 is placed on fleet rank 3, outside the "
                                                          "3-rank fleet"))));
  plan = MakePlan(4, 2, {Spec("w", {8, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].blocks[3].fleet_rank = -1;
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the 2-rank fleet")));
  plan = MakePlan(4, 2, {Spec("w", {8, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].blocks.pop_back();
  EXPECT_THAT(ValidateOne(plan),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("3 placements"), HasSubstr("4 ranks"))));
  plan = MakePlan(4, 2, {Spec("w", {8, 6}, Algorithm::kAuto, Layout::kRows)});
  std::swap(plan.matrices[0].blocks[2], plan.matrices[0].blocks[3]);
  EXPECT_THAT(ValidateOne(plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("placement 2 is for trainer rank 3")));
  plan = MakePlan(2, 2, {Spec("w", {8, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].owner = 2;
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w\" owner"), HasSubstr("2-rank fleet"))));
  plan.trainer_world = 0;
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w\""), HasSubstr("trainer_world"))));
}

TEST(PlanValidationTest, ShapeOptionsAndSplitQkvAreChecked) {
  BatchPlan plan = MakePlan(1, 1, {Spec("w", {4, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].view = Matrix2d{6, 4};
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"w\" view")));
  plan = MakePlan(1, 1, {Spec("w", {4, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].shape = {4, 0};
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"w\" shape")));
  plan = MakePlan(1, 1, {Spec("w", {4, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].options.steps = 101;
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"w\" options")));
  plan = MakePlan(1, 1, {Spec("w", {4, 6}, Algorithm::kAuto, Layout::kRows)});
  plan.matrices[0].options.split_qkv = {2, 1, 2};
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("matrix \"w\" options"), HasSubstr("split_qkv"))));
  // Blockwise: every block is its own matrix, so each block's rows must divide.
  MatrixSpec qkv = Spec("qkv", {8, 6}, Algorithm::kTpBlockwise, Layout::kRows);
  qkv.options.split_qkv = {2, 1, 1};
  EXPECT_OK(ValidateOne(MakePlan(2, 1, {qkv})));
  EXPECT_THAT(ValidateOne(MakePlan(3, 1, {qkv})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("matrix \"qkv\" options (block of trainer rank 0)"), HasSubstr("split_qkv"))));
  qkv.algorithm = Algorithm::kTpDistributed;
  EXPECT_THAT(ValidateOne(MakePlan(3, 1, {qkv})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block of trainer rank 0")));
  qkv.partition_dim = 1;
  qkv.layout = Layout::kCols;
  EXPECT_OK(ValidateOne(MakePlan(3, 1, {qkv})));
}

TEST(PlanValidationTest, BatchLayoutViewRowShardsAndRestrictions) {
  MatrixSpec batch = Spec("b", {4, 3, 5}, Algorithm::kRowSharded, Layout::kRows);
  batch.nd = NdLayout::kBatch;
  BatchPlan plan = MakePlan(2, 1, {batch});  // View 12x5; W = 2 row chunks of 6 = 2 matrices each.
  EXPECT_EQ(plan.matrices[0].view, (Matrix2d{12, 5}));
  EXPECT_OK(ValidateOne(plan));
  // The flattened view is not the batch's.
  plan.matrices[0].view = Matrix2d{4, 15};
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"b\" view")));
  // W = 3: torch.chunk of dim 0 gives 2, 2, 0 matrices (6, 6, 0 view rows), not 4, 4, 4 rows.
  plan = MakePlan(3, 1, {batch});
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("rank 0 of 3 holds 4 rows of a (4, 3, 5) matrix, expected 6")));
  for (int r = 0; r < 3; ++r) plan.matrices[0].blocks[r].block = Block{6 * std::min(r, 2), 0, r < 2 ? 6 : 0, 5};
  EXPECT_OK(ValidateOne(plan));
  // Several matrices take neither split_qkv nor the modes that never assemble the matrix.
  plan = MakePlan(1, 1, {batch});
  plan.matrices[0].options.split_qkv = {1, 1, 1};
  EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nd_layout: split_qkv")));
  for (Algorithm a : {Algorithm::kTpDistributed, Algorithm::kTpBlockwise}) {
    plan = MakePlan(1, 1, {batch});
    plan.matrices[0].algorithm = a;
    EXPECT_THAT(ValidateOne(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("orthogonalizes one matrix from its blocks, not 4 matrices")));
  }
  // One matrix in the batch is just a matrix: everything is allowed.
  MatrixSpec one = Spec("one", {1, 6, 5}, Algorithm::kTpDistributed, Layout::kRows);
  one.nd = NdLayout::kBatch;
  one.options.split_qkv = {1, 1, 1};
  EXPECT_OK(ValidateOne(MakePlan(2, 1, {one})));
}

TEST(PlanValidationTest, OneStatusPerMatrixIndependently) {
  BatchPlan plan = MakePlan(2, 2,
                            {Spec("good", {4, 6}, Algorithm::kAuto, Layout::kGrid),
                             Spec("bad", {4, 6}, Algorithm::kRowSharded, Layout::kCols),
                             Spec("also_good", {4, 6}, Algorithm::kTpBlockwise, Layout::kCols)});
  std::vector<absl::Status> statuses = ValidatePlan(plan);
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_OK(statuses[0]);
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"bad\"")));
  EXPECT_OK(statuses[2]);
}

}  // namespace
}  // namespace orthoserve::testing
