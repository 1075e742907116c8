// CudaBackend on a real GPU: the numerics contract against the tests' own reference (HIGHEST
// within 1e-5 of float64, MEDIUM within 1e-2 of the bf16-emulating loop), batch independence,
// the memory budget, the error paths and creation. Every test skips without a CUDA device,
// except the one that checks creation fails cleanly on a machine without one.
#include "server/engine/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/newton_schulz.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using gpu_testing::CudaDeviceCount;
using gpu_testing::Pack;
using gpu_testing::RandomMatrix;
using gpu_testing::ReferenceFor;
using gpu_testing::RelativeError;
using gpu_testing::RunOne;
using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

// One backend per test binary (creating a cuBLAS handle takes a while).
CudaBackend& SharedBackend() {
  static CudaBackend* backend = [] {
    auto created = CudaBackend::Create(CudaBackend::Options{});
    if (!created.ok()) {
      ADD_FAILURE() << created.status();
      std::abort();
    }
    return created->release();
  }();
  return *backend;
}

TEST(CudaBackendNoDeviceTest, CreateFailsCleanlyWithoutDevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_THAT(CudaBackend::Create(CudaBackend::Options{}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CUDA device")));
}

TEST(CudaBackendTest, CreateRejectsBadOptions) {
  SKIP_WITHOUT_GPU();
  CudaBackend::Options bad_device;
  bad_device.device = CudaDeviceCount();
  EXPECT_THAT(CudaBackend::Create(bad_device), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  CudaBackend::Options bad_budget;
  bad_budget.memory_budget_bytes = -1;
  EXPECT_THAT(CudaBackend::Create(bad_budget),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory_budget_bytes")));
  CudaBackend::Options bad_strips;
  bad_strips.symmetric_min_size = 0;
  EXPECT_THAT(CudaBackend::Create(bad_strips),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("symmetric_min_size")));
}

TEST(CudaBackendTest, InfoNamesTheDevice) {
  SKIP_WITHOUT_GPU();
  const BackendInfo info = SharedBackend().Info();
  EXPECT_EQ(info.name, "cuda");
  EXPECT_THAT(info.device, HasSubstr("(device 0, "));
  EXPECT_THAT(info.device, HasSubstr(" GiB)"));
  EXPECT_GT(info.memory_budget_bytes, 0);
}

struct AccuracyCase {
  std::string name;
  int64_t rows, cols;
  Precision precision;
  CoefficientType coefficients;
  int steps;
  DType in_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
  EpsMode eps_mode = EpsMode::kMax;
  ScaleMode scale_mode = ScaleMode::kSpectral;
  TransposeMode transpose = TransposeMode::kAuto;
  Normalization normalization = Normalization::kFp32;
};

class CudaAccuracyTest : public ::testing::TestWithParam<AccuracyCase> {};

TEST_P(CudaAccuracyTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const AccuracyCase& c = GetParam();
  NsOptions options;
  options.precision = c.precision;
  options.coefficients = c.coefficients;
  options.steps = c.steps;
  options.eps_mode = c.eps_mode;
  options.scale_mode = c.scale_mode;
  options.transpose = c.transpose;
  options.normalization = c.normalization;
  const std::vector<double> g = RandomMatrix(c.rows, c.cols, 17);
  const auto result = RunOne(SharedBackend(), g, c.rows, c.cols, options, c.in_dtype, c.out_dtype);
  ASSERT_OK(result.status);
  const std::vector<double> ref = ReferenceFor(g, c.rows, c.cols, options, c.in_dtype);
  double tolerance = c.precision == Precision::kHighest ? 1e-5 : (c.precision == Precision::kHigh ? 2e-2 : 1e-2);
  // A 16-bit output adds its own rounding (2^-9 relative) on top of the computation.
  if (c.out_dtype != DType::kF32) tolerance = std::max(tolerance, 1e-2);
  EXPECT_LT(RelativeError(result.values, ref), tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaAccuracyTest,
    ::testing::Values(
        AccuracyCase{"square_highest", 64, 64, Precision::kHighest, CoefficientType::kQuintic, 5},
        AccuracyCase{"wide_polar_express", 96, 200, Precision::kHighest, CoefficientType::kPolarExpress, 8},
        AccuracyCase{"tall_transposed", 300, 120, Precision::kHighest, CoefficientType::kQuintic, 5, DType::kF32,
                     DType::kF32, EpsMode::kMax, ScaleMode::kUnitRmsNorm},
        AccuracyCase{"cubic_c0_eps_add", 120, 300, Precision::kHighest, CoefficientType::kCubic5, 5, DType::kF32,
                     DType::kF32, EpsMode::kAdd},
        AccuracyCase{"forced_transpose_off_tall", 160, 90, Precision::kHighest, CoefficientType::kQuintic, 3,
                     DType::kF32, DType::kF32, EpsMode::kMax, ScaleMode::kShapeScaling, TransposeMode::kOff},
        AccuracyCase{"symmetric_strips_highest", 1040, 1100, Precision::kHighest, CoefficientType::kQuintic, 2},
        AccuracyCase{"symmetric_strips_medium_tall", 1100, 1040, Precision::kMedium, CoefficientType::kQuintic, 2,
                     DType::kBF16, DType::kBF16},
        AccuracyCase{"medium_square", 64, 64, Precision::kMedium, CoefficientType::kQuintic, 5},
        AccuracyCase{"medium_cubic_bf16", 200, 96, Precision::kMedium, CoefficientType::kCubic5, 5, DType::kBF16,
                     DType::kBF16},
        AccuracyCase{"medium_deepseek_fp16_in", 128, 256, Precision::kMedium, CoefficientType::kDeepseekV4, 10,
                     DType::kF16, DType::kF32},
        AccuracyCase{"zero_steps_fp16_in_bf16_out", 64, 100, Precision::kHighest, CoefficientType::kQuintic, 0,
                     DType::kF16, DType::kBF16, EpsMode::kMax, ScaleMode::kNone},
        AccuracyCase{"high_tf32", 256, 256, Precision::kHigh, CoefficientType::kQuintic, 5},
        AccuracyCase{"medium_bf16_normalization_tall", 200, 96, Precision::kMedium, CoefficientType::kSimple, 5,
                     DType::kF32, DType::kF32, EpsMode::kMax, ScaleMode::kNone, TransposeMode::kAuto,
                     Normalization::kBf16},
        AccuracyCase{"bf16_normalization_zero_steps_eps_add", 64, 100, Precision::kMedium, CoefficientType::kQuintic,
                     0, DType::kF32, DType::kF32, EpsMode::kAdd, ScaleMode::kNone, TransposeMode::kAuto,
                     Normalization::kBf16}),
    [](const ::testing::TestParamInfo<AccuracyCase>& info) { return info.param.name; });

class CudaCoefficientSweepTest : public ::testing::TestWithParam<std::tuple<CoefficientType, Precision>> {};

TEST_P(CudaCoefficientSweepTest, EveryCoefficientSetMatchesReference) {
  SKIP_WITHOUT_GPU();
  NsOptions options;
  options.coefficients = std::get<0>(GetParam());
  options.precision = std::get<1>(GetParam());
  if (options.coefficients == CoefficientType::kPolarExpress) options.steps = 10;  // Past the list: repeat last.
  if (options.coefficients == CoefficientType::kDeepseekV4) options.steps = 12;
  // aol's list is tuned for exactly 4 steps; cycling back to its first triple maps σ ≈ 1 to a
  // negative value, which amplifies single-ulp bf16 differences (1.8e-2 on the CPU backend).
  if (options.coefficients == CoefficientType::kAol) options.steps = 4;
  const std::vector<double> g = RandomMatrix(96, 160, 23);
  const auto result = RunOne(SharedBackend(), g, 96, 160, options);
  ASSERT_OK(result.status);
  EXPECT_LT(RelativeError(result.values, ReferenceFor(g, 96, 160, options)),
            options.precision == Precision::kMedium ? 1e-2 : 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Sets, CudaCoefficientSweepTest,
                         ::testing::Combine(::testing::Values(CoefficientType::kSimple, CoefficientType::kQuintic,
                                                              CoefficientType::kPolarExpress, CoefficientType::kAol,
                                                              CoefficientType::kCans, CoefficientType::kDeepseekV4,
                                                              CoefficientType::kCubic5),
                                            ::testing::Values(Precision::kHighest, Precision::kMedium)));

TEST(CudaBackendTest, SplitQkvRunsEachPartAsItsOwnMatrix) {
  SKIP_WITHOUT_GPU();
  // Two query groups of q = 32, k = 16, v = 16 rows: Q, K and V are gathered across groups,
  // orthogonalized and scaled each as its own matrix, and written back interleaved.
  const int64_t q = 32, k = 16, v = 16, groups = 2, rows = groups * (q + k + v), cols = 96;
  NsOptions options;
  options.precision = Precision::kHighest;
  options.split_qkv = {q, k, v};
  const std::vector<double> g = RandomMatrix(rows, cols, 29);
  const auto result = RunOne(SharedBackend(), g, rows, cols, options);
  ASSERT_OK(result.status);
  NsOptions plain = options;
  plain.split_qkv.clear();
  const int64_t part_rows[3] = {q, k, v};
  const int64_t first[3] = {0, q, q + k};
  std::vector<double> expected(g.size());
  for (int part = 0; part < 3; ++part) {
    std::vector<double> gathered;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t row0 = gi * (q + k + v) + first[part];
      gathered.insert(gathered.end(), g.begin() + row0 * cols, g.begin() + (row0 + part_rows[part]) * cols);
    }
    const std::vector<double> ref = ReferenceFor(gathered, groups * part_rows[part], cols, plain);
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t row0 = gi * (q + k + v) + first[part];
      std::copy(ref.begin() + gi * part_rows[part] * cols, ref.begin() + (gi + 1) * part_rows[part] * cols,
                expected.begin() + row0 * cols);
    }
  }
  EXPECT_LT(RelativeError(result.values, expected), 1e-5);
}

TEST(CudaBackendTest, ZeroMatrixStaysZero) {
  SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::kHighest, Precision::kMedium}) {
    for (double eps : {1e-7, 0.0}) {  // eps = 0: a zero divisor, skipped as on the CPU backend.
      for (EpsMode mode : {EpsMode::kMax, EpsMode::kAdd}) {
        NsOptions options;
        options.precision = p;
        options.eps = eps;
        options.eps_mode = mode;
        const auto result = RunOne(SharedBackend(), std::vector<double>(40 * 70, 0.0), 40, 70, options);
        ASSERT_OK(result.status);
        for (double value : result.values) ASSERT_EQ(value, 0.0) << "eps " << eps;
      }
    }
  }
}

TEST(CudaBackendTest, ScaleInvarianceAndTranspose) {
  SKIP_WITHOUT_GPU();
  NsOptions options;
  options.precision = Precision::kHighest;
  const std::vector<double> g = RandomMatrix(80, 144, 3);
  std::vector<double> g_scaled = g;
  for (double& v : g_scaled) v *= 37.5;
  const auto base = RunOne(SharedBackend(), g, 80, 144, options);
  const auto scaled = RunOne(SharedBackend(), g_scaled, 80, 144, options);
  ASSERT_OK(base.status);
  ASSERT_OK(scaled.status);
  EXPECT_LT(RelativeError(scaled.values, base.values), 1e-5);

  // NS(Gᵀ) = NS(G)ᵀ: the tall input takes the other operand layout through cuBLAS.
  std::vector<double> gt(g.size());
  for (int i = 0; i < 80; ++i) {
    for (int j = 0; j < 144; ++j) gt[j * 80 + i] = g[i * 144 + j];
  }
  const auto transposed = RunOne(SharedBackend(), gt, 144, 80, options);
  ASSERT_OK(transposed.status);
  std::vector<double> back(g.size());
  for (int i = 0; i < 80; ++i) {
    for (int j = 0; j < 144; ++j) back[i * 144 + j] = transposed.values[j * 80 + i];
  }
  EXPECT_LT(RelativeError(back, base.values), 1e-5);
}

TEST(CudaBackendTest, ZeroRowsStayZero) {
  SKIP_WITHOUT_GPU();
  NsOptions options;
  std::vector<double> g = RandomMatrix(48, 96, 5);
  for (int j = 0; j < 96; ++j) g[7 * 96 + j] = 0;
  const auto result = RunOne(SharedBackend(), g, 48, 96, options);
  ASSERT_OK(result.status);
  for (int j = 0; j < 96; ++j) EXPECT_EQ(result.values[7 * 96 + j], 0.0) << "column " << j;
}

// Builds an NsTask over caller-owned buffers.
struct OwnedTask {
  std::vector<char> in, out;
  NsKernelArgs args;
  NsTask task;
  OwnedTask(int64_t rows, int64_t cols, Precision precision, DType in_dtype, DType out_dtype, uint32_t seed) {
    NsOptions options;
    options.precision = precision;
    in = Pack(RandomMatrix(rows, cols, seed), in_dtype);
    out.assign(static_cast<size_t>(rows * cols) * ElementSize(out_dtype), 0);
    args = ResolveKernelArgs(options, Matrix2d{rows, cols}, Matrix2d{rows, cols});
    task = NsTask{Matrix2d{rows, cols}, in_dtype, in.data(), out_dtype, out.data(), &args};
  }
};

// Runs one task on its own; the status is returned by value (not a reference into Run's
// temporary result vector).
absl::Status RunAlone(Backend& backend, const NsTask& task) { return backend.Run(absl::MakeConstSpan(&task, 1))[0]; }

std::vector<std::unique_ptr<OwnedTask>> MixedTasks() {
  std::vector<std::unique_ptr<OwnedTask>> tasks;
  tasks.push_back(std::make_unique<OwnedTask>(64, 128, Precision::kMedium, DType::kF32, DType::kF32, 1));
  tasks.push_back(std::make_unique<OwnedTask>(256, 96, Precision::kHighest, DType::kBF16, DType::kF32, 2));
  tasks.push_back(std::make_unique<OwnedTask>(64, 128, Precision::kMedium, DType::kF32, DType::kF32, 3));
  tasks.push_back(std::make_unique<OwnedTask>(512, 512, Precision::kMedium, DType::kF16, DType::kBF16, 4));
  tasks.push_back(std::make_unique<OwnedTask>(33, 47, Precision::kHigh, DType::kF32, DType::kF16, 5));
  return tasks;
}

TEST(CudaBackendTest, PipelinedBatchEqualsTasksRunAlone) {
  SKIP_WITHOUT_GPU();
  auto together = MixedTasks();
  std::vector<NsTask> batch;
  batch.reserve(together.size());
  for (auto& t : together) batch.push_back(t->task);
  const std::vector<absl::Status> statuses = SharedBackend().Run(batch);
  ASSERT_EQ(statuses.size(), batch.size());
  auto alone = MixedTasks();
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_OK(statuses[i]);
    ASSERT_OK(RunAlone(SharedBackend(), alone[i]->task));
    EXPECT_EQ(together[i]->out, alone[i]->out) << "task " << i << " differs between the batch and a run alone";
  }
}

TEST(CudaBackendTest, ConcurrentCallersGetTheSameBits) {
  SKIP_WITHOUT_GPU();
  auto expected = MixedTasks();
  for (auto& t : expected) ASSERT_OK(RunAlone(SharedBackend(), t->task));
  std::vector<std::vector<std::unique_ptr<OwnedTask>>> per_thread(4);
  std::vector<std::thread> threads;
  for (auto& tasks : per_thread) {
    tasks = MixedTasks();
    threads.emplace_back([&tasks] {
      std::vector<NsTask> batch;
      batch.reserve(tasks.size());
      for (auto& t : tasks) batch.push_back(t->task);
      for (const absl::Status& s : SharedBackend().Run(batch)) EXPECT_OK(s);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& tasks : per_thread) {
    for (size_t i = 0; i < tasks.size(); ++i) EXPECT_EQ(tasks[i]->out, expected[i]->out) << "task " << i;
  }
}

TEST(CudaBackendTest, InvalidTaskIsRejected) {
  SKIP_WITHOUT_GPU();
  OwnedTask ok(32, 32, Precision::kMedium, DType::kF32, DType::kF32, 9);
  NsTask null_in = ok.task;
  null_in.in = nullptr;
  const auto statuses = SharedBackend().Run({null_in, ok.task});
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_OK(statuses[1]);
}

TEST(CudaBackendTest, OverBudgetTaskIsResourceExhaustedAndOthersRun) {
  SKIP_WITHOUT_GPU();
  CudaBackend::Options options;
  options.memory_budget_bytes = 16 << 20;
  auto created = CudaBackend::Create(options);
  ASSERT_OK(created);
  CudaBackend& small = **created;
  // 1024² fp32: 4 MiB of I/O, two 4 MiB copies of X and two 4 MiB Gram buffers > 16 MiB.
  OwnedTask big(1024, 1024, Precision::kHighest, DType::kF32, DType::kF32, 11);
  OwnedTask fits(64, 96, Precision::kHighest, DType::kF32, DType::kF32, 12);
  OwnedTask fits_too(128, 64, Precision::kMedium, DType::kBF16, DType::kBF16, 13);
  const auto statuses = small.Run({big.task, fits.task, big.task, fits_too.task});
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
  EXPECT_OK(statuses[1]);
  EXPECT_THAT(statuses[2], StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
  EXPECT_OK(statuses[3]);
  EXPECT_LE(small.DeviceBytesHeld(), options.memory_budget_bytes);

  // The small results are right, and the backend keeps working after the failures.
  OwnedTask reference(64, 96, Precision::kHighest, DType::kF32, DType::kF32, 12);
  ASSERT_OK(RunAlone(SharedBackend(), reference.task));
  EXPECT_EQ(fits.out, reference.out);
  OwnedTask again(64, 96, Precision::kHighest, DType::kF32, DType::kF32, 12);
  ASSERT_OK(RunAlone(small, again.task));
  EXPECT_EQ(again.out, reference.out);
}

TEST(CudaBackendTest, FailedKernelLaunchBecomesStatusAndNextTaskRuns) {
  SKIP_WITHOUT_GPU();
  auto created = CudaBackend::Create(CudaBackend::Options{});
  ASSERT_OK(created);
  CudaBackend& backend = **created;
  // Different shapes: two groups, the first of which fails.
  OwnedTask first(64, 80, Precision::kMedium, DType::kF32, DType::kF32, 21);
  OwnedTask second(64, 64, Precision::kMedium, DType::kF32, DType::kF32, 22);
  backend.InjectLaunchFailuresForTest(1);
  const auto statuses = backend.Run({first.task, second.task});
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInternal, HasSubstr("cudaErrorInvalidConfiguration")));
  ASSERT_OK(statuses[1]);
  OwnedTask expected(64, 64, Precision::kMedium, DType::kF32, DType::kF32, 22);
  ASSERT_OK(RunAlone(backend, expected.task));
  EXPECT_EQ(second.out, expected.out);
}

TEST(CudaBackendTest, FailedLaunchInAGroupFailsEachOfItsTasks) {
  SKIP_WITHOUT_GPU();
  auto created = CudaBackend::Create(CudaBackend::Options{});
  ASSERT_OK(created);
  CudaBackend& backend = **created;
  OwnedTask a(64, 64, Precision::kMedium, DType::kF32, DType::kF32, 31);
  OwnedTask b(64, 64, Precision::kMedium, DType::kF32, DType::kF32, 32);
  OwnedTask other(48, 64, Precision::kMedium, DType::kF32, DType::kF32, 33);
  backend.InjectLaunchFailuresForTest(1);
  const auto statuses = backend.Run({a.task, other.task, b.task});
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInternal, HasSubstr("cudaErrorInvalidConfiguration")));
  EXPECT_THAT(statuses[2], StatusIs(absl::StatusCode::kInternal, HasSubstr("cudaErrorInvalidConfiguration")));
  EXPECT_OK(statuses[1]);
}

// Same-shape tasks run as one strided batch; each result has the bits of the task run alone.
TEST(CudaBackendTest, GroupedSameShapeTasksEqualTasksRunAlone) {
  SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols, precision, count] :
       {std::make_tuple(int64_t{96}, int64_t{160}, Precision::kMedium, 12),
        std::make_tuple(int64_t{1100}, int64_t{1030}, Precision::kMedium, 3),
        std::make_tuple(int64_t{1030}, int64_t{1100}, Precision::kHighest, 2),
        std::make_tuple(int64_t{200}, int64_t{72}, Precision::kHigh, 5)}) {
    std::vector<std::unique_ptr<OwnedTask>> group;
    std::vector<NsTask> batch;
    for (int j = 0; j < count; ++j) {
      group.push_back(std::make_unique<OwnedTask>(rows, cols, precision, DType::kF32, DType::kF32, 40 + j));
      batch.push_back(group.back()->task);
    }
    const std::vector<absl::Status> statuses = SharedBackend().Run(batch);
    for (int j = 0; j < count; ++j) {
      ASSERT_OK(statuses[j]);
      OwnedTask alone(rows, cols, precision, DType::kF32, DType::kF32, 40 + j);
      ASSERT_OK(RunAlone(SharedBackend(), alone.task));
      EXPECT_EQ(group[j]->out, alone.out) << rows << "x" << cols << " task " << j << " of " << count;
    }
  }
}

// Copies are counted per direction: a Run of same-shape tasks (one group) uploads their inputs in
// one copy and downloads their results in one (bf16 out: half the bytes).
TEST(CudaBackendTest, CopiesAreCountedByDirection) {
  SKIP_WITHOUT_GPU();
  auto created = CudaBackend::Create(CudaBackend::Options{});
  ASSERT_OK(created);
  CudaBackend& backend = **created;
  EXPECT_EQ(backend.Copies().h2d_calls, 0);
  std::vector<std::unique_ptr<OwnedTask>> group;
  std::vector<NsTask> batch;
  for (int j = 0; j < 3; ++j) {
    group.push_back(std::make_unique<OwnedTask>(64, 96, Precision::kMedium, DType::kF32, DType::kBF16, 70 + j));
    batch.push_back(group.back()->task);
  }
  for (const absl::Status& s : backend.Run(batch)) ASSERT_OK(s);
  const CopyCounts c = backend.Copies();
  EXPECT_EQ(c.h2d_calls, 1);
  EXPECT_EQ(c.h2d_bytes, 3 * 64 * 96 * 4);
  EXPECT_EQ(c.d2h_calls, 1);
  EXPECT_EQ(c.d2h_bytes, 3 * 64 * 96 * 2);
}

// Tasks in the backend's device memory (CudaBackend::memory()): the bits of the same tasks in host
// memory, with no copy between host and device during the Run (two device-to-device copies per
// task: into the group's batch and out of it).
TEST(CudaBackendTest, TasksInDeviceMemoryGiveTheSameBitsWithNoHostCopy) {
  SKIP_WITHOUT_GPU();
  auto created = CudaBackend::Create(CudaBackend::Options{});
  ASSERT_OK(created);
  CudaBackend& backend = **created;
  Memory& memory = backend.memory();
  ASSERT_EQ(memory.space(), MemorySpace::kDevice);
  std::vector<std::unique_ptr<OwnedTask>> group;
  std::vector<NsTask> on_host, on_device;
  std::vector<MemoryBuffer> buffers;
  for (int j = 0; j < 3; ++j) {
    group.push_back(std::make_unique<OwnedTask>(64, 96, Precision::kMedium, DType::kF32, DType::kBF16, 80 + j));
    on_host.push_back(group.back()->task);
  }
  for (const absl::Status& s : backend.Run(on_host)) ASSERT_OK(s);
  for (const auto& t : group) {
    absl::StatusOr<MemoryBuffer> in = memory.Allocate(t->in.size(), false, "test");
    absl::StatusOr<MemoryBuffer> out = memory.Allocate(t->out.size(), true, "test");
    ASSERT_OK(in.status());
    ASSERT_OK(out.status());
    ASSERT_OK(memory.Copy(in->data(), MemorySpace::kDevice, t->in.data(), MemorySpace::kHost, t->in.size()));
    NsTask task = t->task;
    task.in = in->data();
    task.out = out->data();
    task.space = MemorySpace::kDevice;
    on_device.push_back(task);
    buffers.push_back(*std::move(in));
    buffers.push_back(*std::move(out));
  }
  const CopyCounts before = backend.Copies();
  for (const absl::Status& s : backend.Run(on_device)) ASSERT_OK(s);
  const CopyCounts after = backend.Copies();
  EXPECT_EQ(after.h2d_calls, before.h2d_calls);
  EXPECT_EQ(after.d2h_calls, before.d2h_calls);
  EXPECT_EQ(after.d2d_calls - before.d2d_calls, 6);
  for (size_t j = 0; j < group.size(); ++j) {
    std::vector<char> got(group[j]->out.size());
    ASSERT_OK(memory.Copy(got.data(), MemorySpace::kHost, buffers[2 * j + 1].data(), MemorySpace::kDevice, got.size()));
    EXPECT_EQ(got, group[j]->out) << "task " << j;
  }
}

// Graph replay: the first call runs eagerly, the second captures, the next ones replay; every
// result has the bits of the backend without graphs.
TEST(CudaBackendTest, CudaGraphsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  CudaBackend::Options options;
  options.cuda_graphs = true;
  auto created = CudaBackend::Create(options);
  ASSERT_OK(created);
  CudaBackend& graphed = **created;
  auto expected = MixedTasks();
  for (auto& t : expected) ASSERT_OK(RunAlone(SharedBackend(), t->task));
  std::vector<int64_t> captures;
  for (int round = 0; round < 4; ++round) {
    auto tasks = MixedTasks();
    std::vector<NsTask> batch;
    for (auto& t : tasks) batch.push_back(t->task);
    for (const absl::Status& s : graphed.Run(batch)) ASSERT_OK(s);
    for (size_t i = 0; i < tasks.size(); ++i) EXPECT_EQ(tasks[i]->out, expected[i]->out) << "round " << round << " task " << i;
    captures.push_back(graphed.GraphCaptures());
  }
  EXPECT_EQ(captures[0], 0) << "the first call of a shape runs without a graph";
  EXPECT_GT(captures[1], 0) << "the second captures";
  EXPECT_EQ(captures[2], captures[1]) << "later calls replay";
  EXPECT_EQ(captures[3], captures[1]);
  EXPECT_EQ(SharedBackend().GraphCaptures(), 0);
}

// The strip products and a full GEMM compute the same function (up to rounding).
TEST(CudaBackendTest, StripProductsAgreeWithFullGemms) {
  SKIP_WITHOUT_GPU();
  CudaBackend::Options options;
  options.symmetric_min_size = int64_t{1} << 40;
  auto created = CudaBackend::Create(options);
  ASSERT_OK(created);
  for (Precision precision : {Precision::kHighest, Precision::kMedium}) {
    OwnedTask strips(1100, 1536, precision, DType::kF32, DType::kF32, 51);
    OwnedTask full(1100, 1536, precision, DType::kF32, DType::kF32, 51);
    ASSERT_OK(RunAlone(SharedBackend(), strips.task));
    ASSERT_OK(RunAlone(**created, full.task));
    const std::vector<double> a = gpu_testing::Unpack(strips.out, DType::kF32);
    const std::vector<double> b = gpu_testing::Unpack(full.out, DType::kF32);
    EXPECT_LT(RelativeError(a, b), precision == Precision::kHighest ? 1e-5 : 2e-2);
  }
}

}  // namespace
}  // namespace orthoserve
