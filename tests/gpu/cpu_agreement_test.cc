// The CUDA and CPU backends compute the same function: HIGHEST results agree to 2e-5 relative
// Frobenius (each is within 1e-5 of float64), MEDIUM results to 2e-2 (each within 1e-2 of the
// bf16-emulating loop, their own bf16 rounding flips differing).
#include <cstdlib>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using gpu_testing::RandomMatrix;
using gpu_testing::RelativeError;
using gpu_testing::RunOne;

struct AgreementCase {
  int64_t rows, cols;
  Precision precision;
  CoefficientType coefficients;
  DType in_dtype;
  double tolerance;
};

class CpuGpuAgreementTest : public ::testing::TestWithParam<AgreementCase> {};

TEST_P(CpuGpuAgreementTest, SameResultWithinTolerance) {
  SKIP_WITHOUT_GPU();
  const AgreementCase& c = GetParam();
  auto cuda = CudaBackend::Create(CudaBackend::Options{});
  ASSERT_OK(cuda);
  auto cpu = CpuBackend::Create(CpuBackend::Options{});
  ASSERT_OK(cpu);
  NsOptions options;
  options.precision = c.precision;
  options.coefficients = c.coefficients;
  const std::vector<double> g = RandomMatrix(c.rows, c.cols, 41);
  const auto on_gpu = RunOne(**cuda, g, c.rows, c.cols, options, c.in_dtype);
  const auto on_cpu = RunOne(**cpu, g, c.rows, c.cols, options, c.in_dtype);
  ASSERT_OK(on_gpu.status);
  ASSERT_OK(on_cpu.status);
  EXPECT_LT(RelativeError(on_gpu.values, on_cpu.values), c.tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CpuGpuAgreementTest,
    ::testing::Values(AgreementCase{128, 256, Precision::kHighest, CoefficientType::kQuintic, DType::kF32, 2e-5},
                      AgreementCase{300, 100, Precision::kHighest, CoefficientType::kCubic5, DType::kBF16, 2e-5},
                      AgreementCase{128, 256, Precision::kMedium, CoefficientType::kQuintic, DType::kF32, 2e-2},
                      AgreementCase{192, 64, Precision::kMedium, CoefficientType::kPolarExpress, DType::kF16, 2e-2},
                      AgreementCase{96, 96, Precision::kHigh, CoefficientType::kQuintic, DType::kF32, 2e-2}));

}  // namespace
}  // namespace orthoserve
