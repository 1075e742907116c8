// Runs the CUDA backend's step loop (server/engine/cuda/ns_steps.cc, products.cc, lt_gemm.cc:
// operand layouts, op flags, leading dimensions, symmetric strips and their fan-out over streams,
// the C ≠ D epilogues, strided batches and the per-instance algorithm) on the CPU, against the
// tests' reference, by linking it with a host emulation of the few CUDA and cuBLASLt entry points
// it calls instead of the real libraries. This checks the layout logic on machines without a GPU;
// the kernels and the real cuBLASLt are covered by the tests that need a device. The emulated
// cublasLtMatmul follows cuBLASLt's contract: D = alpha·op(A)·op(B) + beta·C per batch instance,
// formed in fp32 and rounded once to D's type, with every layout validated against the op flags
// and the problem; it also checks that the algorithm it is handed is the one the heuristic chose
// for a single instance, and the stream protocol: side streams only run strips after waiting on
// the fork event, and the mirror only runs once every side stream has been joined back.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cuda/kernels.h"
#include "server/engine/cuda/ns_steps.h"
#include "server/engine/newton_schulz.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

#include "tests/gpu/cublaslt_emulation.h"

namespace {
using orthoserve::gpu_emulation::Emulation;
using orthoserve::gpu_emulation::g;
}  // namespace


namespace orthoserve {
namespace {

int g_tokens[8];
cudaStream_t FakeStream(int i) { return reinterpret_cast<cudaStream_t>(&g_tokens[i]); }
cudaEvent_t FakeEvent(int i) { return reinterpret_cast<cudaEvent_t>(&g_tokens[4 + i]); }

struct LayoutCase {
  std::string name;
  int64_t rows, cols;
  Precision precision;
  TransposeMode transpose;
  CoefficientType coefficients;
  int steps;
  int64_t batch;
  int64_t expected_calls;  // cublasLtMatmul calls the step loop makes.
};

// Runs the step loop on `batch` random matrices (seeds 7, 8, ...) through the emulation and
// returns each matrix's scaled result; fails the test on any contract violation it saw.
std::vector<std::vector<double>> RunEmulated(const LayoutCase& c, bool refuse_batched, int64_t fail_call = 0,
                                             absl::Status* status = nullptr, int32_t split_k = 1) {
  NsOptions o;
  o.precision = c.precision;
  o.transpose = c.transpose;
  o.coefficients = c.coefficients;
  o.steps = c.steps;
  const NsKernelArgs args = ResolveKernelArgs(o, Matrix2d{c.rows, c.cols}, Matrix2d{c.rows, c.cols});
  const bool medium = c.precision == Precision::kMedium;
  const cuda::GemmPrecision prec = cuda::ForPrecision(c.precision);
  const int64_t numel = c.rows * c.cols;
  const bool is_x = args.transpose;
  const int64_t m = is_x ? c.cols : c.rows, n = is_x ? c.rows : c.cols;
  const size_t es = prec.element_size();
  std::vector<char> x0(c.batch * numel * es), x1(x0.size()), a(c.batch * m * m * es), b(a.size());
  for (int64_t j = 0; j < c.batch; ++j) {
    const std::vector<double> g = gpu_testing::RandomMatrix(c.rows, c.cols, 7 + static_cast<uint32_t>(j));
    // Normalize as the kernel does (fp32 division), into the row-major buffer the backend uploads.
    double sumsq = 0;
    for (double v : g) sumsq += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
    const float d = std::fmax(static_cast<float>(std::sqrt(sumsq)), static_cast<float>(args.eps));
    for (int64_t i = 0; i < numel; ++i) {
      const float v = static_cast<float>(g[i]) / d;
      if (medium) {
        reinterpret_cast<uint16_t*>(x0.data())[j * numel + i] = FloatToBf16(v);
      } else {
        reinterpret_cast<float*>(x0.data())[j * numel + i] = v;
      }
    }
  }
  auto lt = cuda::LtGemm::Create();
  EXPECT_OK(lt);
  if (!lt.ok()) return {};
  cuda::BlasDevice dev;
  dev.lt = lt->get();
  dev.main = cuda::Lane{FakeStream(0), cuda::Workspace{nullptr, 1 << 20}, nullptr};
  for (int i = 0; i < 3; ++i) {
    dev.side.push_back(cuda::Lane{FakeStream(1 + i), cuda::Workspace{nullptr, 1 << 20}, FakeEvent(1 + i)});
  }
  dev.fork = FakeEvent(0);
  dev.precision = prec;
  g = Emulation{};
  g.main = dev.main.stream;
  g.fork = dev.fork;
  g.refuse_batched = refuse_batched;
  g.fail_call = fail_call;
  g.split_k = split_k;
  auto result = cuda::RunSchedule(dev, args.schedule, cuda::WorkMatrix{x0.data(), is_x, m, n, c.batch}, x1.data(),
                                  a.data(), b.data());
  if (status != nullptr) {
    *status = result.status();
    return {};
  }
  EXPECT_OK(result);
  for (const std::string& e : g.errors) ADD_FAILURE() << e;
  if (!result.ok()) return {};
  std::vector<std::vector<double>> outs(c.batch, std::vector<double>(numel));
  for (int64_t j = 0; j < c.batch; ++j) {
    for (int64_t i = 0; i < numel; ++i) {
      const int64_t at = j * numel + i;
      const float v =
          medium ? Bf16ToFloat(static_cast<const uint16_t*>(*result)[at]) : static_cast<const float*>(*result)[at];
      outs[j][i] = static_cast<double>(v * static_cast<float>(args.scale));
    }
  }
  return outs;
}

class CudaLayoutEmulationTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(CudaLayoutEmulationTest, StepLoopMatchesReference) {
  const LayoutCase& c = GetParam();
  const std::vector<std::vector<double>> outs = RunEmulated(c, /*refuse_batched=*/false);
  ASSERT_EQ(static_cast<int64_t>(outs.size()), c.batch);
  EXPECT_EQ(g.matmul_calls, c.expected_calls);
  EXPECT_EQ(g.batched_calls, c.batch > 1 ? c.expected_calls : 0) << "every product runs the batch in one call";
  NsOptions o;
  o.precision = c.precision;
  o.transpose = c.transpose;
  o.coefficients = c.coefficients;
  o.steps = c.steps;
  const NsKernelArgs args = ResolveKernelArgs(o, Matrix2d{c.rows, c.cols}, Matrix2d{c.rows, c.cols});
  const bool medium = c.precision == Precision::kMedium;
  for (int64_t j = 0; j < c.batch; ++j) {
    const std::vector<double> g_in = gpu_testing::RandomMatrix(c.rows, c.cols, 7 + static_cast<uint32_t>(j));
    const std::vector<double> ref = gpu_testing::ReferenceNs(g_in, c.rows, c.cols, args, medium);
    EXPECT_LT(gpu_testing::RelativeError(outs[j], ref), medium ? 1e-2 : 1e-5) << "matrix " << j;
  }
}

// Strips: m = 1040 ≥ kSymmetricMinSize gives 2 strips per symmetric product (on two streams),
// so one quintic step is 2 (Gram) + 2 (A·A) + 1 (update) products; below it 1 + 1 + 1, and the
// c = 0 path skips A·A. A batch runs in the same number of calls.
INSTANTIATE_TEST_SUITE_P(
    Cases, CudaLayoutEmulationTest,
    ::testing::Values(
        LayoutCase{"wide_highest", 40, 72, Precision::kHighest, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 1,
                   15},
        LayoutCase{"tall_highest", 72, 40, Precision::kHighest, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 1,
                   15},
        LayoutCase{"tall_untransposed", 60, 30, Precision::kHighest, TransposeMode::kOff, CoefficientType::kQuintic, 3,
                   1, 9},
        LayoutCase{"wide_medium", 40, 72, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 1,
                   15},
        LayoutCase{"tall_medium_cubic", 72, 40, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kCubic5, 5,
                   1, 10},
        LayoutCase{"batch_wide_medium", 40, 72, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 5,
                   4, 15},
        LayoutCase{"batch_tall_highest", 72, 40, Precision::kHighest, TransposeMode::kAuto, CoefficientType::kQuintic,
                   3, 3, 9},
        LayoutCase{"strips_highest", 1040, 1060, Precision::kHighest, TransposeMode::kAuto, CoefficientType::kQuintic,
                   1, 1, 5},
        LayoutCase{"strips_medium_tall", 1060, 1040, Precision::kMedium, TransposeMode::kAuto,
                   CoefficientType::kQuintic, 1, 1, 5},
        LayoutCase{"strips_batch_medium", 1040, 1030, Precision::kMedium, TransposeMode::kAuto,
                   CoefficientType::kQuintic, 1, 2, 5}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) { return info.param.name; });

TEST(CudaLayoutEmulation, StripsFanOutOverTheSideStreams) {
  RunEmulated(LayoutCase{"strips", 1040, 1030, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 1,
                         1, 5},
              false);
  EXPECT_EQ(g.streams.size(), 2u) << "two strips, two streams";
  g = Emulation{};
  RunEmulated(LayoutCase{"small", 40, 72, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 1, 1, 3},
              false);
  EXPECT_EQ(g.streams.size(), 1u) << "one full product stays on the main stream";
}

// A product that fails on a side stream: the error comes back as INTERNAL with cuBLASLt's name,
// and every forked side stream has still been joined back into the main one.
TEST(CudaLayoutEmulation, FailedStripStillJoinsTheSideStreams) {
  absl::Status status;
  RunEmulated(LayoutCase{"strips", 1040, 1030, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 1,
                         1, 5},
              false, /*fail_call=*/2, &status);
  EXPECT_THAT(status, ::orthoserve::testing::StatusIs(absl::StatusCode::kInternal, ::testing::HasSubstr("cublasLtMatmul")));
  EXPECT_FALSE(g.unjoined.empty());
  for (const auto& [stream, pending] : g.unjoined) EXPECT_FALSE(pending) << "a side stream was left forked";
}

// When the single-instance algorithm cannot run the strided batch, each instance runs alone with
// it: more calls, the same bits.
TEST(CudaLayoutEmulation, RefusedBatchRunsInstancesWithTheSameBits) {
  const LayoutCase c{"refused", 40, 72, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 3, 15};
  const std::vector<std::vector<double>> batched = RunEmulated(c, false);
  EXPECT_EQ(g.matmul_calls, 15);
  const std::vector<std::vector<double>> apart = RunEmulated(c, true);
  EXPECT_EQ(g.matmul_calls, 45);
  EXPECT_EQ(g.batched_calls, 0);
  EXPECT_EQ(batched, apart);
}

// A split-K algorithm never runs a strided batch: each instance is its own (identical) call.
TEST(CudaLayoutEmulation, SplitKAlgorithmsRunInstancesOneByOne) {
  const LayoutCase c{"split_k", 40, 72, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 3, 15};
  const std::vector<std::vector<double>> batched = RunEmulated(c, false);
  const std::vector<std::vector<double>> split = RunEmulated(c, false, 0, nullptr, /*split_k=*/4);
  EXPECT_EQ(g.matmul_calls, 45);
  EXPECT_EQ(g.batched_calls, 0);
  EXPECT_EQ(batched, split);
}

// Batch independence of the layout logic: matrix j of a batch equals the same matrix alone.
TEST(CudaLayoutEmulation, BatchedMatrixEqualsItselfAlone) {
  const std::vector<std::vector<double>> batched =
      RunEmulated(LayoutCase{"b", 72, 40, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 2, 15},
                  false);
  const std::vector<std::vector<double>> alone =
      RunEmulated(LayoutCase{"a", 72, 40, Precision::kMedium, TransposeMode::kAuto, CoefficientType::kQuintic, 5, 1, 15},
                  false);
  ASSERT_EQ(batched.size(), 2u);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(batched[0], alone[0]);
}

TEST(CudaLayoutEmulation, SymmetricStripsCoverTheUpperTriangle) {
  for (int64_t m : {1, 100, 1023, 1024, 1040, 2048, 4096, 4097, 8192, 11008}) {
    const std::vector<int64_t> s = cuda::SymmetricStrips(m, cuda::kSymmetricMinSize);
    ASSERT_GE(s.size(), 2u) << m;
    EXPECT_EQ(s.front(), 0) << m;
    EXPECT_EQ(s.back(), m) << m;
    EXPECT_LE(s.size() - 1, 8u) << m;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      EXPECT_LT(s[i], s[i + 1]) << m;
      if (i + 2 < s.size()) {
        EXPECT_EQ((s[i + 1] - s[i]) % 128, 0) << m;
      }
    }
    if (m < 1024) {
      EXPECT_EQ(s.size(), 2u) << m << ": one full product below the threshold";
    }
    // Work of the strips relative to the full product.
    double area = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) area += static_cast<double>(s[i + 1] - s[i]) * (m - s[i]);
    const double fraction = area / (static_cast<double>(m) * m);
    if (m >= 8192) {
      EXPECT_LT(fraction, 0.57) << m;
    }
  }
  EXPECT_EQ(cuda::SymmetricStrips(4096, 8192).size(), 2u) << "a higher threshold keeps 4096 whole";
}

}  // namespace
}  // namespace orthoserve
