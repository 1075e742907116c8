// CpuBackend's own contract: Create's checks, Info, per-task INVALID_ARGUMENT, the reductions a
// sharded participant makes (even with no shards), MEDIUM's bf16 results, and the bits of steps = 0
// (one thread or several) and of the sum of squares' order.
#include "server/engine/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cpu/bf16_round.h"
#include "server/engine/cpu/working_matrix.h"
#include "server/engine/newton_schulz.h"
#include "tests/unit/engine/engine_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

TEST(CpuBackendTest, CreateRejectsBadThreadCounts) {
  for (int threads : {0, -1, 257}) {
    CpuBackend::Options o;
    o.threads = threads;
    EXPECT_THAT(CpuBackend::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("threads")));
  }
}

TEST(CpuBackendTest, InfoNamesTheBackendAndThreads) {
  BackendInfo info = CpuBackendWithThreads(2).Info();
  EXPECT_EQ(info.name, "cpu");
  EXPECT_THAT(info.device, HasSubstr("OpenBLAS"));
  EXPECT_THAT(info.device, HasSubstr("2 threads"));
}

TEST(CpuBackendTest, BadTasksFailAloneWithInvalidArgument) {
  NsKernelArgs args;
  args.schedule = {{3.0, -3.0, 1.0}};
  args.precision = Precision::kHighest;
  std::vector<float> in(12, 1.0f), out(12, 0.0f), good_out(12, 0.0f);
  std::vector<NsTask> tasks = {
      NsTask{{3, 4}, DType::kF32, nullptr, DType::kF32, out.data(), &args},
      NsTask{{3, 4}, DType::kF32, in.data(), DType::kF32, good_out.data(), &args},
      NsTask{{0, 4}, DType::kF32, in.data(), DType::kF32, out.data(), &args},
      NsTask{{3, -4}, DType::kF32, in.data(), DType::kF32, out.data(), &args},
      NsTask{{3, 4}, DType::kF32, in.data(), DType::kF32, out.data(), nullptr},
  };
  std::vector<absl::Status> s = CpuBackendWithThreads(1).Run(tasks);
  ASSERT_EQ(s.size(), tasks.size());
  EXPECT_THAT(s[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null input or output")));
  EXPECT_OK(s[1]);
  EXPECT_THAT(s[2], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be positive")));
  EXPECT_THAT(s[3], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be positive")));
  EXPECT_THAT(s[4], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null kernel arguments")));
  // The good task ran: a rank-one all-ones matrix normalized and stepped stays constant.
  EXPECT_NE(good_out[0], 0.0f);
  for (float v : good_out) EXPECT_EQ(v, good_out[0]);
}

TEST(CpuBackendTest, EngineNamesTheMatrixInErrors) {
  NsOptions o;
  MatrixJob job;
  job.name = "layer3.w";
  job.shape = job.scale_shape = {4, 4};
  job.options = &o;
  EXPECT_THAT(OrthogonalizeOne(CpuBackendWithThreads(1), job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer3.w")));
}

TEST(CpuBackendTest, EngineRejectsAMissingScaleShape) {
  NsOptions o;
  std::vector<float> in(16, 1.0f), out(16, 0.0f);
  MatrixJob job;
  job.name = "w";
  job.shape = {4, 4};  // scale_shape left at {0, 0}.
  job.in = in.data();
  job.out = out.data();
  job.options = &o;
  EXPECT_THAT(OrthogonalizeOne(CpuBackendWithThreads(1), job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale_shape 0x0")));
}

// Counts reductions and their sizes; a lone participant's sum is its own values.
class CountingReducer : public SumReducer {
 public:
  absl::Status AllReduceSum(absl::Span<float> values) override {
    float_sizes.push_back(values.size());
    for (float v : values) nonzero += v != 0.0f;
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(absl::Span<double> values) override {
    double_sizes.push_back(values.size());
    return absl::OkStatus();
  }
  std::vector<size_t> float_sizes, double_sizes;
  int nonzero = 0;
};

TEST(CpuBackendTest, ParticipantWithoutShardsJoinsEveryReductionWithZeros) {
  NsKernelArgs args;
  args.schedule = std::vector<CoefficientTriple>(5, {3.0, -3.0, 1.0});
  NsShardedTask task{{}, 1, 7, &args};
  CountingReducer reducer;
  ASSERT_OK(CpuBackendWithThreads(1).RunSharded(task, reducer));
  EXPECT_EQ(reducer.double_sizes, std::vector<size_t>({1}));
  EXPECT_EQ(reducer.float_sizes, std::vector<size_t>(5, 49));
  EXPECT_EQ(reducer.nonzero, 0);
}

TEST(CpuBackendTest, NonFiniteInputFailsTheTaskBeforeItWritesAnything) {
  // FailsNonFiniteInput: the sum of squares is finite exactly when every element is, so a NaN
  // or Inf anywhere fails the task — with steps or without, on one thread or several, in any
  // dtype — and its `out` keeps what it held.
  EXPECT_TRUE(CpuBackendWithThreads(1).FailsNonFiniteInput());
  struct Case {
    int64_t rows, cols;
    int steps;
    DType dtype;
    int64_t at;
    double value;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {{8, 12, 5, DType::kF32, 0, nan},          {12, 8, 5, DType::kBF16, 95, -inf},
                                   {7, 9, 0, DType::kF16, 40, inf},          {1024, 1030, 0, DType::kF32, 1000000, nan},
                                   {1024, 1030, 0, DType::kBF16, 17, -inf}};
  for (const Case& c : cases) {
    for (int threads : {1, 2}) {
      std::vector<double> g = RandomMatrix(c.rows, c.cols, 77);
      g[c.at] = c.value;
      const std::vector<char> in = Pack(g, c.dtype);
      std::vector<char> out(in.size(), '\x5a');
      NsKernelArgs args;
      args.schedule = std::vector<CoefficientTriple>(c.steps, {3.0, -3.0, 1.0});
      NsTask task{{c.rows, c.cols}, c.dtype, in.data(), c.dtype, out.data(), &args};
      const std::vector<absl::Status> run = CpuBackendWithThreads(threads).Run({task});
      EXPECT_THAT(run[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite value (NaN or Inf)")))
          << c.rows << "x" << c.cols << " steps " << c.steps << " on " << threads << " threads";
      EXPECT_EQ(out, std::vector<char>(in.size(), '\x5a')) << "written although it failed";
    }
  }
}

TEST(CpuBackendTest, NonFiniteInputOnAnyParticipantStopsEveryOneAfterTheFirstReduction) {
  NsKernelArgs args;
  args.schedule = std::vector<CoefficientTriple>(5, {3.0, -3.0, 1.0});
  // This participant's shard holds an Inf.
  std::vector<float> in(8, 1.0f), out(8, 7.0f);
  in[3] = std::numeric_limits<float>::infinity();
  NsShardedTask task{{NsShard{{2, 4}, DType::kF32, in.data(), DType::kF32, out.data()}}, 1, 2, &args};
  CountingReducer counting;
  EXPECT_THAT(CpuBackendWithThreads(1).RunSharded(task, counting),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
  EXPECT_EQ(counting.double_sizes, std::vector<size_t>({1}));
  EXPECT_THAT(counting.float_sizes, ::testing::IsEmpty());
  EXPECT_EQ(out, std::vector<float>(8, 7.0f));
  // Another participant's shard does: the reduced sum tells this one, whose shard is finite.
  class NanFromElsewhere : public CountingReducer {
   public:
    absl::Status AllReduceSum(absl::Span<double> values) override {
      for (double& v : values) v += std::numeric_limits<double>::quiet_NaN();
      return CountingReducer::AllReduceSum(values);
    }
    using CountingReducer::AllReduceSum;
  } elsewhere;
  std::fill(in.begin(), in.end(), 1.0f);
  EXPECT_THAT(CpuBackendWithThreads(1).RunSharded(task, elsewhere),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
  EXPECT_THAT(elsewhere.float_sizes, ::testing::IsEmpty());
  EXPECT_EQ(out, std::vector<float>(8, 7.0f));
}

TEST(CpuBackendTest, ReducerErrorsAbortTheTask) {
  class Failing : public SumReducer {
   public:
    absl::Status AllReduceSum(absl::Span<float>) override { return absl::UnavailableError("peer 2 is gone"); }
    absl::Status AllReduceSum(absl::Span<double>) override { return absl::OkStatus(); }
  } reducer;
  NsKernelArgs args;
  args.schedule = {{3.0, -3.0, 1.0}};
  std::vector<float> in(8, 1.0f), out(8, 0.0f);
  NsShardedTask task{{NsShard{{2, 4}, DType::kF32, in.data(), DType::kF32, out.data()}}, 1, 2, &args};
  EXPECT_THAT(CpuBackendWithThreads(1).RunSharded(task, reducer),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("peer 2")));
}

TEST(CpuBackendTest, NoStepsGivesTheBitsOfTheWorkingMatrixPath) {
  // Run computes steps = 0 in two passes straight from `in` to `out` (fp32 to fp32 in one
  // vectorized loop, AVX2 where the CPU has it); a one-participant sharded
  // task along dim 1 still goes through the working matrix (load, sum of squares, normalize,
  // store) in the same order, so the two must agree bit for bit — for every dtype pair,
  // precision and eps mode, counts that are not multiples of 4 or of the block, unaligned
  // buffers, and an all-zero matrix.
  struct Case {
    int64_t rows, cols;
    size_t misalign;  // Bytes added to both buffer addresses.
    bool zeros;
  };
  const std::vector<Case> cases = {{7, 5, 0, false}, {3, 2049, 0, false}, {64, 100, 0, false},
                                   {9, 700, 2, false}, {6, 6, 0, true}};
  int compared = 0;
  for (const Case& c : cases) {
    std::vector<double> g = RandomMatrix(c.rows, c.cols, 75);
    if (c.zeros) std::fill(g.begin(), g.end(), 0.0);
    for (DType in_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType out_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (Precision precision : {Precision::kMedium, Precision::kHighest}) {
          for (EpsMode eps_mode : {EpsMode::kMax, EpsMode::kAdd}) {
            NsKernelArgs args;
            args.precision = precision;
            args.eps_mode = eps_mode;
            args.eps = c.zeros ? 0.0 : 1e-7;
            args.transpose = true;  // Ignored without steps.
            args.scale = 1.7;
            const std::vector<char> packed = Pack(g, in_dtype);
            const size_t out_bytes = packed.size() / ElementSize(in_dtype) * ElementSize(out_dtype);
            std::vector<char> in(packed.size() + c.misalign), run_out(out_bytes + c.misalign),
                sharded_out(out_bytes + c.misalign);
            std::memcpy(in.data() + c.misalign, packed.data(), packed.size());
            const Matrix2d shape{c.rows, c.cols};
            NsTask task{shape, in_dtype, in.data() + c.misalign, out_dtype, run_out.data() + c.misalign, &args};
            const std::vector<absl::Status> run = CpuBackendWithThreads(1).Run({task});
            ASSERT_OK(run[0]);
            NsShardedTask sharded{
                {NsShard{shape, in_dtype, in.data() + c.misalign, out_dtype, sharded_out.data() + c.misalign}},
                1, c.rows, &args};
            CountingReducer lone;
            ASSERT_OK(CpuBackendWithThreads(1).RunSharded(sharded, lone));
            EXPECT_EQ(run_out, sharded_out) << c.rows << "x" << c.cols << " " << DTypeName(in_dtype) << " -> "
                                            << DTypeName(out_dtype) << " " << PrecisionName(precision);
            if (in_dtype == out_dtype) {
              // In place (`out` == `in`): fp32 takes the blocked path instead of the one-pass loop,
              // with the same bits.
              std::vector<char> in_place = in;
              NsTask same{shape, in_dtype, in_place.data() + c.misalign, out_dtype, in_place.data() + c.misalign,
                          &args};
              const std::vector<absl::Status> ran = CpuBackendWithThreads(1).Run({same});
              ASSERT_OK(ran[0]);
              EXPECT_EQ(std::vector<char>(in_place.begin() + c.misalign, in_place.end()),
                        std::vector<char>(run_out.begin() + c.misalign, run_out.end()))
                  << "in place " << c.rows << "x" << c.cols << " " << DTypeName(in_dtype);
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 5 * 9 * 4);
}

TEST(CpuBackendTest, NoStepsOnSeveralThreadsGivesTheBitsOfOne) {
  // Large matrices without steps are split over the backend's threads (the sum of squares by its
  // blocks, the store by slices); the bits must be one thread's, and the working-matrix path's,
  // for counts that are not a multiple of the block, unaligned buffers, mixed dtypes and in place.
  struct Case {
    int64_t rows, cols;
    DType in_dtype, out_dtype;
    size_t misalign;
  };
  const std::vector<Case> cases = {{1031, 1029, DType::kF32, DType::kF32, 0},
                                   {2048, 1030, DType::kBF16, DType::kF32, 2},
                                   {1500, 777, DType::kF32, DType::kF16, 0},
                                   {4096, 300, DType::kF16, DType::kBF16, 0}};
  for (const Case& c : cases) {
    const std::vector<char> packed = Pack(RandomMatrix(c.rows, c.cols, 76), c.in_dtype);
    const size_t out_bytes = packed.size() / ElementSize(c.in_dtype) * ElementSize(c.out_dtype);
    std::vector<char> in(packed.size() + c.misalign);
    std::memcpy(in.data() + c.misalign, packed.data(), packed.size());
    NsKernelArgs args;
    args.scale = 0.3;
    const Matrix2d shape{c.rows, c.cols};
    const std::string what = absl::StrCat(c.rows, "x", c.cols, " ", DTypeName(c.in_dtype), " -> ",
                                          DTypeName(c.out_dtype));

    std::vector<char> sharded_out(out_bytes);
    NsShardedTask sharded{{NsShard{shape, c.in_dtype, in.data() + c.misalign, c.out_dtype, sharded_out.data()}},
                          1, c.rows, &args};
    CountingReducer lone;
    ASSERT_OK(CpuBackendWithThreads(1).RunSharded(sharded, lone));
    for (int threads : {1, 2, 3}) {
      std::vector<char> out(out_bytes + c.misalign);
      NsTask task{shape, c.in_dtype, in.data() + c.misalign, c.out_dtype, out.data() + c.misalign, &args};
      const std::vector<absl::Status> run = CpuBackendWithThreads(threads).Run({task});
      ASSERT_OK(run[0]);
      EXPECT_EQ(std::vector<char>(out.begin() + c.misalign, out.end()), sharded_out)
          << what << " on " << threads << " threads";
      if (ElementSize(c.in_dtype) == ElementSize(c.out_dtype)) {
        std::vector<char> in_place = in;
        NsTask same{shape, c.in_dtype, in_place.data() + c.misalign, c.out_dtype, in_place.data() + c.misalign,
                    &args};
        const std::vector<absl::Status> ran = CpuBackendWithThreads(threads).Run({same});
        ASSERT_OK(ran[0]);
        EXPECT_EQ(std::vector<char>(in_place.begin() + c.misalign, in_place.end()), sharded_out)
            << what << " in place on " << threads << " threads";
      }
    }
  }
}

TEST(CpuBackendTest, SumOfSquaresAddsInItsDocumentedOrder) {
  // An independent writing of working_matrix.h's order: blocks of kSquaresBlock, sixteen lanes
  // by position in the block, lanes added pairwise, blocks in order. Values of very different
  // sizes make another order give other bits (checked below for one).
  std::vector<float> x(3 * kSquaresBlock + 21);
  uint32_t state = 12345;
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    v = std::ldexp(static_cast<float>(state >> 8) / (1 << 24) - 0.5f, static_cast<int>(state % 40) - 20);
  }
  for (int64_t count : {int64_t{1}, int64_t{15}, int64_t{17}, kSquaresBlock, kSquaresBlock + 1,
                        static_cast<int64_t>(x.size())}) {
    double total = 0;
    for (int64_t start = 0; start < count; start += kSquaresBlock) {
      double lanes[kSquareLanes] = {};
      for (int64_t j = 0; j < std::min(kSquaresBlock, count - start); ++j) {
        lanes[j % kSquareLanes] += static_cast<double>(x[start + j]) * x[start + j];
      }
      for (int width = kSquareLanes / 2; width > 0; width /= 2) {
        for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
      }
      total += lanes[0];
    }
    EXPECT_EQ(SumOfSquares(x.data(), count), total) << count << " elements";
    const std::vector<char> bf16 = Pack(std::vector<double>(x.begin(), x.begin() + count), DType::kBF16);
    const std::vector<double> seen = Unpack(bf16, DType::kBF16);
    const std::vector<float> widened(seen.begin(), seen.end());
    EXPECT_EQ(SumOfSquaresOf(DType::kBF16, bf16.data(), count), SumOfSquares(widened.data(), count))
        << count << " bf16 elements";
  }
  double in_order = 0;
  for (float v : x) in_order += static_cast<double>(v) * v;
  EXPECT_NE(SumOfSquares(x.data(), static_cast<int64_t>(x.size())), in_order)
      << "these values do not tell the orders apart";
}

TEST(CpuBackendTest, MediumResultsAreBf16ValuesAndHighestAreNot) {
  NsOptions o;
  o.scale_mode = ScaleMode::kNone;
  std::vector<double> g = RandomMatrix(16, 24, 70);
  o.precision = Precision::kMedium;
  NsRun medium = RunNs(CpuBackendWithThreads(1), g, 16, 24, o);
  o.precision = Precision::kHighest;
  NsRun highest = RunNs(CpuBackendWithThreads(1), g, 16, 24, o);
  ASSERT_OK(medium.status);
  ASSERT_OK(highest.status);
  int highest_off_grid = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(medium.values[i], RefBf16(medium.values[i])) << i;
    highest_off_grid += highest.values[i] != RefBf16(highest.values[i]);
  }
  EXPECT_GT(highest_off_grid, static_cast<int>(g.size()) / 2);
}

TEST(CpuBackendTest, MediumFollowsTheBf16LoopClosely) {
  // The 1e-2 bound of the accuracy tests also holds for an fp32 result (fp32 and bf16 loops
  // differ by about 6e-3 after 5 steps), so over one and two steps on small matrices — where
  // fp32 accumulation order rarely moves a bf16 rounding and the steps have no time to amplify
  // one that moved — MEDIUM must match the bf16-emulating reference far more tightly, which it
  // cannot unless A, B and X are each rounded exactly where the contract says.
  for (CoefficientType type : {CoefficientType::kQuintic, CoefficientType::kCubic5}) {
    for (int steps : {1, 2}) {
      for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{24, 40}, {40, 24}, {32, 32}}) {
        for (uint32_t seed : {72u, 73u, 74u}) {
          NsOptions medium;
          medium.coefficients = CoefficientType::kCustom;
          for (const RefTriple& t : RefSchedule(type, steps)) medium.custom_coefficients.push_back({t.a, t.b, t.c});
          medium.steps = steps;
          medium.precision = Precision::kMedium;
          NsOptions highest = medium;
          highest.precision = Precision::kHighest;
          std::vector<double> g = RandomMatrix(rows, cols, seed);
          NsRun run = RunNs(CpuBackendWithThreads(1), g, rows, cols, medium);
          ASSERT_OK(run.status);
          const std::vector<double> medium_ref = Reference(g, rows, cols, medium);
          const std::string what = absl::StrCat(rows, "x", cols, " ", CoefficientTypeName(type), " steps ", steps);
          EXPECT_LE(RelativeError(run.values, medium_ref), 2e-4) << what;
          EXPECT_GE(RelativeError(Reference(g, rows, cols, highest), medium_ref), 1e-3) << what;
        }
      }
    }
  }
}

TEST(CpuBackendTest, Bf16NormalizationFollowsTorchsOrder) {
  // normalization bf16 (torch.optim.Muon's order) against the reference's own emulation of it:
  // with no steps the result is the normalized matrix itself, which must be bit for bit the
  // reference's (every operation is one rounding of an exactly known value); over one and two
  // steps as tightly as MEDIUM follows its loop. And it must differ from fp32 normalization, else
  // the test could not tell the two apart.
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{24, 40}, {40, 24}, {33, 17}}) {
    for (EpsMode mode : {EpsMode::kMax, EpsMode::kAdd}) {
      for (uint32_t seed : {80u, 81u}) {
        NsOptions o;
        o.scale_mode = ScaleMode::kNone;
        o.precision = Precision::kMedium;
        o.normalization = Normalization::kBf16;
        o.eps_mode = mode;
        o.coefficients = CoefficientType::kSimple;
        std::vector<double> g = RandomMatrix(rows, cols, seed);
        const std::string what = absl::StrCat(rows, "x", cols, " ", EpsModeName(mode), " seed ", seed);
        o.steps = 0;
        NsRun zero = RunNs(CpuBackendWithThreads(2), g, rows, cols, o);
        ASSERT_OK(zero.status);
        EXPECT_EQ(zero.values, Reference(g, rows, cols, o)) << what;
        NsOptions fp32 = o;
        fp32.normalization = Normalization::kFp32;
        NsRun fp32_zero = RunNs(CpuBackendWithThreads(2), g, rows, cols, fp32);
        ASSERT_OK(fp32_zero.status);
        EXPECT_NE(zero.values, fp32_zero.values) << what;
        for (int steps : {1, 2}) {
          o.steps = steps;
          NsRun run = RunNs(CpuBackendWithThreads(1), g, rows, cols, o);
          ASSERT_OK(run.status);
          EXPECT_LE(RelativeError(run.values, Reference(g, rows, cols, o)), 2e-4) << what << " steps " << steps;
        }
      }
    }
  }
}

TEST(CpuBackendTest, Bf16NormalizationNeedsMediumPrecision) {
  NsOptions o;
  o.normalization = Normalization::kBf16;
  EXPECT_OK(ValidateNsOptions(o, "m"));
  for (Precision p : {Precision::kHighest, Precision::kHigh}) {
    o.precision = p;
    EXPECT_THAT(ValidateNsOptions(o, "matrix \"w\" options"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("matrix \"w\" options: normalization bf16 (torch.optim.Muon's order) needs "
                                   "precision medium")));
  }
}

TEST(CpuBackendTest, InlineBf16RoundingIsBitIdenticalToCommonDtype) {
  // Every 2^12-th bit pattern (covering every exponent, both signs, Inf and NaN payloads),
  // plus every pattern near the rounding boundary of a few exponents.
  auto check = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    const float a = RoundToBf16Inline(f), b = RoundToBf16(f);
    uint32_t ab, bb;
    std::memcpy(&ab, &a, sizeof(ab));
    std::memcpy(&bb, &b, sizeof(bb));
    return ab == bb;
  };
  int mismatches = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093) mismatches += !check(static_cast<uint32_t>(bits));
  for (uint32_t high : {0x3f80u, 0x3f81u, 0xbf80u, 0x7f7fu, 0x7f80u, 0x7fc0u, 0xff80u, 0x0000u, 0x8001u}) {
    for (uint32_t low = 0; low <= 0xffffu; ++low) mismatches += !check((high << 16) | low);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CpuBackendTest, RefBf16AgreesWithTheWireConversion) {
  // The reference's rounding is written independently; both must be round-to-nearest-even.
  for (double v : RandomMatrix(1, 4096, 71)) {
    const float f = static_cast<float>(v * 1e3);
    EXPECT_EQ(RefBf16(f), static_cast<double>(RoundToBf16(f))) << f;
  }
  EXPECT_EQ(RefBf16(1.0 + 1.0 / 256), 1.0);              // Tie, even stays.
  EXPECT_EQ(RefBf16(1.0 + 3.0 / 256), 1.0 + 4.0 / 256);  // Tie, odd rounds up.
}

}  // namespace
}  // namespace orthoserve::testing
