// The algorithms against single-matrix NS on the same CPU backend, over Gloo on loopback:
// AUTO, ROW_SHARDED, GATHERED and TP_DUPLICATED bit-identical to engine NS of the whole matrix;
// TP_DISTRIBUTED within the precision's tolerance; TP_BLOCKWISE bit-identical to per-block NS.
// Parameterized over the fleet size S and the trainer world W (W < S, W = S, W > S).
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/distributed/batch_harness.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

// One input matrix and its options; every algorithm runs on a copy of it in the same batch.
struct Family {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  DType result_dtype;
  Precision precision;
  std::vector<int64_t> split_qkv;
};

const std::vector<Family>& Families() {
  static const std::vector<Family> families = {
      {"f32_5x7", {5, 7}, DType::kF32, DType::kF32, Precision::kHighest, {}},
      {"bf16_16x24", {16, 24}, DType::kBF16, DType::kF32, Precision::kHighest, {}},
      {"f32_33x20_medium", {33, 20}, DType::kF32, DType::kF32, Precision::kMedium, {}},
      {"f16_2x9", {2, 9}, DType::kF16, DType::kF32, Precision::kHighest, {}},
      {"bf16_6x4x3_to_bf16", {6, 4, 3}, DType::kBF16, DType::kBF16, Precision::kHighest, {}},
      {"f32_12x10_qkv", {12, 10}, DType::kF32, DType::kF32, Precision::kHighest, {2, 1, 1}},
      {"bf16_3x40_medium_to_bf16", {3, 40}, DType::kBF16, DType::kBF16, Precision::kMedium, {}},
      {"f16_24x8", {24, 8}, DType::kF16, DType::kF16, Precision::kHighest, {}},
  };
  return families;
}

enum class Check { kWhole, kDistributed, kBlockwise };

struct Variant {
  std::string suffix;
  Algorithm algorithm;
  int partition_dim;
  Layout layout;
  Check check;
};

std::vector<Variant> VariantsFor(const Family& f, bool odd, bool medium_both) {
  std::vector<Variant> v = {
      {"auto_grid", Algorithm::kAuto, 0, Layout::kGrid, Check::kWhole},
      {"auto_reversed", Algorithm::kAuto, 0, Layout::kReversedRows, Check::kWhole},
      {"auto_whole_on_last", Algorithm::kAuto, 0, Layout::kWholeOnLast, Check::kWhole},
      {"row_sharded", Algorithm::kRowSharded, 0, Layout::kRows, Check::kWhole},
      {"gathered_grid", Algorithm::kGathered, 0, Layout::kGrid, Check::kWhole},
      {"tp_duplicated0", Algorithm::kTpDuplicated, 0, Layout::kRows, Check::kWhole},
      {"tp_duplicated1", Algorithm::kTpDuplicated, 1, Layout::kCols, Check::kWhole},
  };
  // TP_DISTRIBUTED costs two small all-reduces per NS step, so each family runs it along one
  // partition dim (both for one MEDIUM family): dim 0 for the even families, dim 1 for the odd
  // ones and for split_qkv (whose column shards keep whole query groups; its row shards are
  // tested in execute_test.cc with a layout that keeps them).
  if ((!odd || medium_both) && f.split_qkv.empty()) {
    v.push_back({"tp_distributed0", Algorithm::kTpDistributed, 0, Layout::kRows, Check::kDistributed});
  }
  if (odd || medium_both || !f.split_qkv.empty()) {
    v.push_back({"tp_distributed1", Algorithm::kTpDistributed, 1, Layout::kCols, Check::kDistributed});
  }
  if (f.split_qkv.empty()) {
    v.push_back({"blockwise_grid", Algorithm::kTpBlockwise, 0, Layout::kGrid, Check::kBlockwise});
  } else {
    v.push_back({"blockwise_cols", Algorithm::kTpBlockwise, 0, Layout::kCols, Check::kBlockwise});
  }
  return v;
}

enum class WorldKind { kOne, kTwo, kSame, kDouble, kFive };

int TrainerWorld(WorldKind kind, int s) {
  switch (kind) {
    case WorldKind::kOne:
      return 1;
    case WorldKind::kTwo:
      return 2;
    case WorldKind::kSame:
      return s;
    case WorldKind::kDouble:
      return 2 * s;
    case WorldKind::kFive:
      return 5;
  }
  return 1;
}

class EquivalenceTest : public ::testing::TestWithParam<std::tuple<int, WorldKind>> {
 protected:
  void SetUp() override {
    s_ = std::get<0>(GetParam());
    w_ = TrainerWorld(std::get<1>(GetParam()), s_);
    // Each (S, W) pair runs once: skip the kinds that repeat an earlier one.
    for (int k = 0; k < static_cast<int>(std::get<1>(GetParam())); ++k) {
      if (TrainerWorld(static_cast<WorldKind>(k), s_) == w_) GTEST_SKIP() << "W = " << w_ << " runs in another case";
    }
  }
  int s_ = 1;
  int w_ = 1;
};

TEST_P(EquivalenceTest, MixedBatchMatchesSingleMatrixNs) {
  std::vector<MatrixSpec> specs;
  std::vector<Check> checks;
  std::vector<size_t> family_of;
  const std::vector<Family>& families = Families();
  for (size_t fi = 0; fi < families.size(); ++fi) {
    const Family& f = families[fi];
    for (const Variant& v : VariantsFor(f, fi % 2 == 1, fi == 2)) {
      MatrixSpec spec;
      spec.name = absl::StrCat(f.name, "/", v.suffix);
      spec.shape = f.shape;
      spec.dtype = f.dtype;
      spec.result_dtype = f.result_dtype;
      spec.options.precision = f.precision;
      spec.options.split_qkv = f.split_qkv;
      spec.algorithm = v.algorithm;
      spec.partition_dim = v.partition_dim;
      spec.layout = v.layout;
      spec.seed = static_cast<uint32_t>(100 + fi);
      specs.push_back(spec);
      checks.push_back(v.check);
      family_of.push_back(fi);
    }
  }
  const BatchPlan plan = MakePlan(w_, s_, specs);
  for (const absl::Status& status : ValidatePlan(plan)) ASSERT_OK(status);
  BatchData data = MakeData(plan, specs);
  Backend& backend = SharedCpuBackend();
  std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&backend});
  ASSERT_EQ(results.size(), static_cast<size_t>(s_));
  for (int rank = 0; rank < s_; ++rank) {
    ASSERT_OK(results[rank]);
    ASSERT_EQ(results[rank]->matrices.size(), specs.size());
    for (size_t m = 0; m < specs.size(); ++m) {
      EXPECT_TRUE(results[rank]->matrices[m].ok()) << specs[m].name << ": " << results[rank]->matrices[m];
    }
  }

  for (size_t m = 0; m < specs.size(); ++m) {
    SCOPED_TRACE(specs[m].name);
    const MatrixPlan& mp = plan.matrices[m];
    const std::vector<char> got = AssembleResult(plan, data, static_cast<int>(m));
    if (checks[m] == Check::kWhole) {
      const std::vector<char> want = WholeReference(backend, mp, data.whole[m]);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "not bit-identical to whole-matrix NS";
    } else if (checks[m] == Check::kBlockwise) {
      const std::vector<char> want = BlockwiseReference(backend, mp, data.whole[m]);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "not bit-identical to per-block NS";
    } else {
      const std::vector<char> want = WholeReference(backend, mp, data.whole[m]);
      double tolerance = mp.options.precision == Precision::kMedium ? 2e-2 : 1e-5;
      // A bf16 result may round the two computations' values to neighbouring bf16 values.
      if (mp.result_dtype != DType::kF32) tolerance += 1e-2;
      const double error = RelativeFrobenius(ToF32(mp.result_dtype, got), ToF32(mp.result_dtype, want));
      EXPECT_LE(error, tolerance);
    }
  }
}

// ND_LAYOUT_BATCH tensors: every algorithm that assembles the matrix gives each matrix of the
// batch bit for bit what it gives alone. ROW_SHARDED shards the tensor's dim 0 (whole matrices
// of the batch), the TP modes the stacked 2-D view.
TEST_P(EquivalenceTest, BatchLayoutMatchesEachMatrixAlone) {
  const std::vector<std::pair<std::string, std::tuple<Algorithm, int, Layout>>> variants = {
      {"auto_grid", {Algorithm::kAuto, 0, Layout::kGrid}},
      {"row_sharded", {Algorithm::kRowSharded, 0, Layout::kRows}},
      {"gathered_grid", {Algorithm::kGathered, 0, Layout::kGrid}},
      {"tp_duplicated0", {Algorithm::kTpDuplicated, 0, Layout::kRows}},
      {"tp_duplicated1", {Algorithm::kTpDuplicated, 1, Layout::kCols}},
  };
  std::vector<MatrixSpec> specs;
  for (const auto& [suffix, v] : variants) {
    MatrixSpec spec;
    spec.name = "batch_5x6x4/" + suffix;
    spec.shape = {5, 6, 4};
    spec.nd = NdLayout::kBatch;
    spec.options.precision = Precision::kHighest;
    spec.algorithm = std::get<0>(v);
    spec.partition_dim = std::get<1>(v);
    spec.layout = std::get<2>(v);
    spec.seed = 7;
    specs.push_back(spec);
  }
  BatchPlan plan = MakePlan(w_, s_, specs);
  // ROW_SHARDED: torch.chunk of dim 0 (5 matrices) over W ranks, 6 view rows per matrix.
  const std::vector<int64_t> sizes = ChunkSizes(5, w_);
  const std::vector<int64_t> offsets = ChunkOffsets(5, w_);
  for (int r = 0; r < w_; ++r) plan.matrices[1].blocks[r].block = Block{offsets[r] * 6, 0, sizes[r] * 6, 4};
  for (const absl::Status& status : ValidatePlan(plan)) ASSERT_OK(status);
  BatchData data = MakeData(plan, specs);
  Backend& backend = SharedCpuBackend();
  std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&backend});
  for (int rank = 0; rank < s_; ++rank) {
    ASSERT_OK(results[rank]);
    for (size_t m = 0; m < specs.size(); ++m) {
      ASSERT_TRUE(results[rank]->matrices[m].ok()) << specs[m].name << ": " << results[rank]->matrices[m];
    }
  }
  for (size_t m = 0; m < specs.size(); ++m) {
    SCOPED_TRACE(specs[m].name);
    const std::vector<char> got = AssembleResult(plan, data, static_cast<int>(m));
    const std::vector<char> want = WholeReference(backend, plan.matrices[m], data.whole[m]);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "not bit-identical to each matrix alone";
  }
}

TEST_P(EquivalenceTest, AutoComputesEachMatrixOnceAndBalances) {
  std::vector<MatrixSpec> specs;
  for (int i = 0; i < 8; ++i) {
    MatrixSpec spec;
    spec.name = absl::StrCat("w", i);
    spec.shape = {16, 12 + 4 * (i % 3)};
    spec.options.precision = Precision::kHighest;
    spec.layout = i % 2 == 0 ? Layout::kGrid : Layout::kRows;
    spec.seed = 7 + i;
    specs.push_back(spec);
  }
  const BatchPlan plan = MakePlan(w_, s_, specs);
  BatchData data = MakeData(plan, specs);
  Backend& backend = SharedCpuBackend();
  std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&backend});
  ASSERT_EQ(results.size(), static_cast<size_t>(s_));
  double total_flops = 0;
  for (int rank = 0; rank < s_; ++rank) {
    ASSERT_OK(results[rank]);
    double owned_flops = 0;
    for (const MatrixPlan& m : plan.matrices) {
      if (m.owner == rank) owned_flops += NsFlops(m.view.rows, m.view.cols, m.options);
    }
    EXPECT_DOUBLE_EQ(results[rank]->flops, owned_flops) << "rank " << rank;
    if (s_ > 1) {
      EXPECT_GT(results[rank]->collective_time, absl::ZeroDuration());
    }
    total_flops += results[rank]->flops;
  }
  double want_flops = 0;
  for (const MatrixPlan& m : plan.matrices) want_flops += NsFlops(m.view.rows, m.view.cols, m.options);
  EXPECT_DOUBLE_EQ(total_flops, want_flops);
  for (size_t m = 0; m < specs.size(); ++m) {
    const std::vector<char> got = AssembleResult(plan, data, static_cast<int>(m));
    const std::vector<char> want = WholeReference(backend, plan.matrices[m], data.whole[m]);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << specs[m].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fleets, EquivalenceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(WorldKind::kOne, WorldKind::kTwo, WorldKind::kSame,
                                                              WorldKind::kDouble, WorldKind::kFive)),
                         [](const ::testing::TestParamInfo<std::tuple<int, WorldKind>>& info) {
                           const int s = std::get<0>(info.param);
                           return absl::StrCat("S", s, "_W", TrainerWorld(std::get<1>(info.param), s), "_k",
                                               static_cast<int>(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace orthoserve::testing
