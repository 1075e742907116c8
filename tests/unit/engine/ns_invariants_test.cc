// The invariants of docs/numerics.md (scale invariance, transposition, zero rows and columns) and
// determinism: the same bits twice, alone or inside a batch, and concurrently from two threads.
#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/newton_schulz.h"
#include "tests/unit/engine/engine_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::Values;

class InvariantTest : public ::testing::TestWithParam<Precision> {
 protected:
  NsOptions Options() const {
    NsOptions o;
    o.precision = GetParam();
    return o;
  }
  double Tolerance() const { return GetParam() == Precision::kMedium ? kMediumTolerance : kHighestTolerance; }
};

TEST_P(InvariantTest, PowerOfTwoScaleGivesTheSameBits) {
  std::vector<double> g = RandomMatrix(18, 30, 21), g4 = g;
  for (double& v : g4) v *= 4.0;  // Exact in fp32, so the normalized matrix is the same.
  NsRun a = RunNs(CpuBackendWithThreads(1), g, 18, 30, Options());
  NsRun b = RunNs(CpuBackendWithThreads(1), g4, 18, 30, Options());
  ASSERT_OK(a.status);
  ASSERT_OK(b.status);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST_P(InvariantTest, PositiveScaleDoesNotChangeTheResult) {
  std::vector<double> g = RandomMatrix(18, 30, 22), g3 = g;
  for (double& v : g3) v *= 3.7;
  NsRun a = RunNs(CpuBackendWithThreads(1), g, 18, 30, Options());
  NsRun b = RunNs(CpuBackendWithThreads(1), g3, 18, 30, Options());
  ASSERT_OK(a.status);
  ASSERT_OK(b.status);
  EXPECT_LE(RelativeError(b.values, a.values), Tolerance());
}

TEST_P(InvariantTest, TransposedInputGivesTheTransposedResultBitForBit) {
  // Auto transpose: the tall Gᵀ is worked on as (Gᵀ)ᵀ = G, the very same working matrix.
  std::vector<double> g = RandomMatrix(14, 26, 23);
  NsRun a = RunNs(CpuBackendWithThreads(1), g, 14, 26, Options());
  NsRun b = RunNs(CpuBackendWithThreads(1), TransposeOf(g, 14, 26), 26, 14, Options());
  ASSERT_OK(a.status);
  ASSERT_OK(b.status);
  EXPECT_EQ(TransposeOf(a.values, 14, 26), b.values);
}

TEST_P(InvariantTest, SquareTransposedInputGivesTheTransposedResult) {
  // Square: both work on their own orientation, so the Grams differ (GGᵀ vs GᵀG).
  std::vector<double> g = RandomMatrix(20, 20, 24);
  NsRun a = RunNs(CpuBackendWithThreads(1), g, 20, 20, Options());
  NsRun b = RunNs(CpuBackendWithThreads(1), TransposeOf(g, 20, 20), 20, 20, Options());
  ASSERT_OK(a.status);
  ASSERT_OK(b.status);
  EXPECT_LE(RelativeError(b.values, TransposeOf(a.values, 20, 20)), Tolerance());
}

TEST_P(InvariantTest, ZeroRowsAndColumnsStayZeroAndLeaveTheRestAlone) {
  NsOptions o = Options();
  o.scale_mode = ScaleMode::kNone;  // The padded matrix has another shape, hence another scale.
  const int64_t rows = 12, cols = 20;
  std::vector<double> g = RandomMatrix(rows, cols, 25);
  NsRun base = RunNs(CpuBackendWithThreads(1), g, rows, cols, o);
  ASSERT_OK(base.status);

  // Pad with 3 zero rows (interleaved) and 5 zero columns (at the front and the end).
  const int64_t prow = rows + 3, pcol = cols + 5;
  auto src_row = [](int64_t r) { return r == 2 || r == 7 || r == 14 ? -1 : r - (r > 2) - (r > 7); };
  auto src_col = [&](int64_t c) { return c < 2 || c >= cols + 2 ? -1 : c - 2; };
  std::vector<double> padded(prow * pcol, 0.0);
  for (int64_t r = 0; r < prow; ++r) {
    for (int64_t c = 0; c < pcol; ++c) {
      if (src_row(r) >= 0 && src_col(c) >= 0) padded[r * pcol + c] = g[src_row(r) * cols + src_col(c)];
    }
  }
  NsRun run = RunNs(CpuBackendWithThreads(1), padded, prow, pcol, o);
  ASSERT_OK(run.status);
  std::vector<double> inner;
  for (int64_t r = 0; r < prow; ++r) {
    for (int64_t c = 0; c < pcol; ++c) {
      const double v = run.values[r * pcol + c];
      if (src_row(r) < 0 || src_col(c) < 0) {
        EXPECT_EQ(v, 0.0) << r << "," << c;
      }
    }
  }
  for (int64_t r = 0; r < prow; ++r) {
    if (src_row(r) < 0) continue;
    for (int64_t c = 0; c < pcol; ++c) {
      if (src_col(c) >= 0) inner.push_back(run.values[r * pcol + c]);
    }
  }
  EXPECT_LE(RelativeError(inner, base.values), GetParam() == Precision::kMedium ? 1e-2 : 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Precisions, InvariantTest, Values(Precision::kHighest, Precision::kMedium));

// A batch of matrices of different shapes and options, in fp32 and bf16.
struct Batch {
  std::vector<std::vector<char>> ins, outs;
  std::vector<NsOptions> options;
  std::vector<MatrixJob> jobs;

  Batch() {
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{40, 24}, {24, 72}, {33, 33}, {8, 100}};
    options.resize(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      options[i].precision = i % 2 == 0 ? Precision::kMedium : Precision::kHighest;
      const DType dtype = i % 2 == 0 ? DType::kBF16 : DType::kF32;
      const auto [rows, cols] = shapes[i];
      ins.push_back(Pack(RandomMatrix(rows, cols, 30 + static_cast<uint32_t>(i)), dtype));
      outs.emplace_back(static_cast<size_t>(rows * cols) * ElementSize(dtype), 0);
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const DType dtype = i % 2 == 0 ? DType::kBF16 : DType::kF32;
      MatrixJob job;
      job.name = "m" + std::to_string(i);
      job.shape = job.scale_shape = {shapes[i].first, shapes[i].second};
      job.in_dtype = job.out_dtype = dtype;
      job.in = ins[i].data();
      job.out = outs[i].data();
      job.options = &options[i];
      jobs.push_back(job);
    }
  }
  void Run(Backend& backend) {
    for (const absl::Status& s : Orthogonalize(backend, jobs)) ASSERT_OK(s);
  }
};

class DeterminismTest : public ::testing::TestWithParam<int> {};

TEST_P(DeterminismTest, SameBitsTwice) {
  Batch a, b;
  a.Run(CpuBackendWithThreads(GetParam()));
  b.Run(CpuBackendWithThreads(GetParam()));
  EXPECT_EQ(a.outs, b.outs);
}

TEST_P(DeterminismTest, SameBitsAloneAndInsideABatch) {
  Batch batch;
  batch.Run(CpuBackendWithThreads(GetParam()));
  for (size_t i = 0; i < batch.jobs.size(); ++i) {
    Batch alone;
    for (const absl::Status& s : Orthogonalize(CpuBackendWithThreads(GetParam()), {alone.jobs[i]})) ASSERT_OK(s);
    EXPECT_EQ(alone.outs[i], batch.outs[i]) << "job " << i;
  }
}

TEST_P(DeterminismTest, SameBitsConcurrentlyFromTwoThreads) {
  Batch alone;
  alone.Run(CpuBackendWithThreads(GetParam()));
  for (int round = 0; round < 3; ++round) {
    Batch x, y;
    std::thread tx([&] { x.Run(CpuBackendWithThreads(GetParam())); });
    std::thread ty([&] { y.Run(CpuBackendWithThreads(GetParam())); });
    tx.join();
    ty.join();
    EXPECT_EQ(x.outs, alone.outs);
    EXPECT_EQ(y.outs, alone.outs);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, DeterminismTest, Values(1, 2, 3));

TEST(DeterminismTest, ThreadCountsAgreeWithinTolerance) {
  Batch one, three;
  one.Run(CpuBackendWithThreads(1));
  three.Run(CpuBackendWithThreads(3));
  for (size_t i = 0; i < one.outs.size(); ++i) {
    const DType dtype = one.jobs[i].out_dtype;
    const double tolerance = i % 2 == 0 ? 2e-2 : kHighestTolerance;
    EXPECT_LE(RelativeError(Unpack(three.outs[i], dtype), Unpack(one.outs[i], dtype)), tolerance) << "job " << i;
  }
}

}  // namespace
}  // namespace orthoserve::testing
