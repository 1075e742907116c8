// Shapes, torch.chunk splits and block tiling of common/shape.h.
#include "common/shape.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ViewAs2d, CollapsesTrailingDims) {
  auto m = ViewAs2d({4, 3, 2, 5}, "w");
  ASSERT_OK(m);
  EXPECT_EQ(m->rows, 4);
  EXPECT_EQ(m->cols, 30);
}

TEST(ViewAs2d, RejectsBadShapes) {
  EXPECT_THAT(ViewAs2d({5}, "matrix \"b\" shape"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix \"b\" shape")));
  EXPECT_THAT(ViewAs2d({3, 0}, "w"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dim 1 = 0")));
  EXPECT_THAT(ViewAs2d({-2, 3}, "w"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THAT(ViewAs2d({big, 4}, "w"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int64")));
  EXPECT_THAT(ViewAs2d({2, big, 4}, "w"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int64")));
}

TEST(ViewAs2d, BatchStacksTheLastTwoDimsByRows) {
  auto m = ViewAs2d({4, 3, 2, 5}, "w", NdLayout::kBatch);
  ASSERT_OK(m);
  EXPECT_EQ(m->rows, 24);  // 12 matrices of 2 x 5.
  EXPECT_EQ(m->cols, 5);
  EXPECT_EQ(BatchRows({4, 3, 2, 5}, NdLayout::kBatch), 2);
  EXPECT_EQ(BatchRows({4, 3, 2, 5}, NdLayout::kFlatten), 0);
  // Two dims, or one matrix in the batch: the same single matrix either way.
  EXPECT_EQ(*ViewAs2d({6, 7}, "w", NdLayout::kBatch), *ViewAs2d({6, 7}, "w"));
  EXPECT_EQ(BatchRows({6, 7}, NdLayout::kBatch), 0);
  EXPECT_EQ(BatchRows({1, 6, 7}, NdLayout::kBatch), 0);
  EXPECT_EQ(ViewAs2d({1, 6, 7}, "w", NdLayout::kBatch)->rows, 6);
  EXPECT_THAT(ViewAs2d({2, 0, 7}, "w", NdLayout::kBatch), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dim 1 = 0")));
}

TEST(NdLayout, NamesRoundTrip) {
  for (NdLayout layout : {NdLayout::kFlatten, NdLayout::kBatch}) {
    NdLayout parsed = NdLayout::kFlatten;
    ASSERT_OK(ParseNdLayout(NdLayoutName(layout), &parsed));
    EXPECT_EQ(parsed, layout);
  }
  NdLayout parsed;
  EXPECT_THAT(ParseNdLayout("stack", &parsed),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected flatten or batch")));
}

TEST(ChunkSizes, MatchesTorchChunk) {
  EXPECT_THAT(ChunkSizes(7, 4), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(ChunkSizes(5, 4), ElementsAre(2, 2, 1, 0));
  EXPECT_THAT(ChunkSizes(2, 4), ElementsAre(1, 1, 0, 0));
  EXPECT_THAT(ChunkSizes(9, 3), ElementsAre(3, 3, 3));
  EXPECT_THAT(ChunkSizes(10, 4), ElementsAre(3, 3, 3, 1));
  EXPECT_THAT(ChunkOffsets(10, 4), ElementsAre(0, 3, 6, 9, 10));
}

TEST(ChunkBlock, IsPartOfChunkOffsetsAlongEitherDim) {
  // Every part of every (n, world) up to 13 x 9: the rows (dim 0) or columns (dim 1) ChunkOffsets
  // gives, the whole other dim, and an empty part at the end of its dim.
  for (int64_t n = 1; n <= 13; ++n) {
    for (int world = 1; world <= 9; ++world) {
      const std::vector<int64_t> offsets = ChunkOffsets(n, world);
      for (int part = 0; part < world; ++part) {
        SCOPED_TRACE(absl::StrCat("n ", n, " world ", world, " part ", part));
        const int64_t size = offsets[part + 1] - offsets[part];
        EXPECT_TRUE(ChunkBlock(Matrix2d{n, 5}, world, part, 0) == (Block{offsets[part], 0, size, 5}));
        EXPECT_TRUE(ChunkBlock(Matrix2d{5, n}, world, part, 1) == (Block{0, offsets[part], 5, size}));
      }
    }
  }
}

TEST(FleetRank, ContiguousAndEven) {
  // W = 4 trainers on S = 3 fleet ranks: 0,0,1,2.
  EXPECT_EQ(FleetRankOfTrainer(0, 4, 3), 0);
  EXPECT_EQ(FleetRankOfTrainer(1, 4, 3), 0);
  EXPECT_EQ(FleetRankOfTrainer(2, 4, 3), 1);
  EXPECT_EQ(FleetRankOfTrainer(3, 4, 3), 2);
  EXPECT_EQ(FleetRankOfTrainer(0, 1, 5), 0);
}

TEST(CheckTiling, AcceptsExactCover) {
  Matrix2d m{4, 6};
  std::vector<Block> blocks = {{0, 0, 2, 6}, {2, 0, 2, 3}, {2, 3, 2, 3}, {0, 0, 0, 0}};
  EXPECT_OK(CheckTiling(m, blocks, "matrix \"w\""));
}

TEST(CheckTiling, RejectsOverlapGapAndOutside) {
  Matrix2d m{4, 6};
  EXPECT_THAT(CheckTiling(m, std::vector<Block>{{0, 0, 3, 6}, {2, 0, 2, 6}}, "matrix \"w\""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps")));
  EXPECT_THAT(CheckTiling(m, std::vector<Block>{{0, 0, 2, 6}, {3, 0, 1, 6}}, "matrix \"w\""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gap")));
  EXPECT_THAT(CheckTiling(m, std::vector<Block>{{0, 0, 4, 7}}, "matrix \"w\""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not lie inside")));
}

TEST(CopyBlock, OutAndInRoundTrip) {
  std::vector<float> full(4 * 5);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  Block b{1, 2, 2, 3};
  std::vector<float> part(6);
  CopyBlockOut(full.data(), 5, b, sizeof(float), part.data());
  EXPECT_THAT(part, ElementsAre(7, 8, 9, 12, 13, 14));
  std::vector<float> back(20, -1);
  CopyBlockIn(part.data(), b, sizeof(float), back.data(), 5);
  EXPECT_EQ(back[7], 7);
  EXPECT_EQ(back[14], 14);
  EXPECT_EQ(back[0], -1);
}

}  // namespace
}  // namespace orthoserve
