// Runs the CUDA backend's step loop (server/engine/cuda/ns_steps.cc and products.cc: operand
// layouts, cuBLAS op flags, leading dimensions, symmetric strips, fused beta epilogues) on the
// CPU, against the tests' reference, by linking it with a host emulation of the few CUDA and
// cuBLAS entry points it calls instead of the real libraries. This checks the layout logic on
// machines without a GPU; the kernels and the real cuBLAS are covered by the tests that need a
// device. The emulated cublasGemmEx follows cuBLAS's contract: C = alpha·op(A)·op(B) + beta·C,
// formed in fp32 and rounded once to C's type, leading dimensions validated.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "server/engine/cuda/kernels.h"
#include "server/engine/cuda/ns_steps.h"
#include "server/engine/newton_schulz.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

namespace {

int64_t g_gemm_calls = 0;

float Load(cudaDataType t, const void* p, int64_t i) {
  if (t == CUDA_R_16BF) return orthoserve::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void Store(cudaDataType t, void* p, int64_t i, float v) {
  if (t == CUDA_R_16BF) {
    static_cast<uint16_t*>(p)[i] = orthoserve::FloatToBf16(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

}  // namespace

// The emulated entry points (the test binary links neither libcudart nor libcublas).
extern "C" {
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt,
                            int ldb, const void* beta, void* c, cudaDataType ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  ++g_gemm_calls;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // op(A) as an m × k row-major float array, op(B) as k × n.
  std::vector<float> oa(static_cast<size_t>(m) * k), ob(static_cast<size_t>(k) * n);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      oa[static_cast<size_t>(i) * k + p] = ta == CUBLAS_OP_N ? Load(at, a, i + static_cast<int64_t>(p) * lda)
                                                             : Load(at, a, p + static_cast<int64_t>(i) * lda);
    }
  }
  for (int p = 0; p < k; ++p) {
    for (int j = 0; j < n; ++j) {
      ob[static_cast<size_t>(p) * n + j] = tb == CUBLAS_OP_N ? Load(bt, b, p + static_cast<int64_t>(j) * ldb)
                                                             : Load(bt, b, j + static_cast<int64_t>(p) * ldb);
    }
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  std::vector<float> acc(static_cast<size_t>(n));
  for (int i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int p = 0; p < k; ++p) {
      const float x = oa[static_cast<size_t>(i) * k + p];
      const float* row = &ob[static_cast<size_t>(p) * n];
      for (int j = 0; j < n; ++j) acc[j] += x * row[j];
    }
    for (int j = 0; j < n; ++j) {
      const int64_t idx = i + static_cast<int64_t>(j) * ldc;
      Store(ct, c, idx, al * acc[j] + (be == 0.0f ? 0.0f : be * Load(ct, c, idx)));
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMULATED"; }
const char* cublasGetStatusString(cublasStatus_t) { return "emulated"; }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
const char* cudaGetErrorString(cudaError_t) { return "emulated"; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 0;
  return cudaSuccess;
}
}

namespace orthoserve::cuda {
// Host version of the mirror kernel (kernels.cu is not linked).
cudaError_t MirrorUpper(DType dtype, void* c, int64_t m, int64_t ld, cudaStream_t) {
  for (int64_t col = 0; col < m; ++col) {
    for (int64_t row = col + 1; row < m; ++row) {
      if (dtype == DType::kF32) {
        static_cast<float*>(c)[row + col * ld] = static_cast<float*>(c)[col + row * ld];
      } else {
        static_cast<uint16_t*>(c)[row + col * ld] = static_cast<uint16_t*>(c)[col + row * ld];
      }
    }
  }
  return cudaSuccess;
}
}  // namespace orthoserve::cuda

namespace orthoserve {
namespace {

struct LayoutCase {
  std::string name;
  int64_t rows, cols;
  Precision precision;
  TransposeMode transpose;
  CoefficientType coefficients;
  int steps;
  int64_t expected_gemms;  // cuBLAS calls the step loop makes.
};

class CudaLayoutEmulationTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(CudaLayoutEmulationTest, StepLoopMatchesReference) {
  const LayoutCase& c = GetParam();
  NsOptions o;
  o.precision = c.precision;
  o.transpose = c.transpose;
  o.coefficients = c.coefficients;
  o.steps = c.steps;
  const NsKernelArgs args = ResolveKernelArgs(o, Matrix2d{c.rows, c.cols}, Matrix2d{c.rows, c.cols});
  const std::vector<double> g = gpu_testing::RandomMatrix(c.rows, c.cols, 7);
  const bool medium = c.precision == Precision::kMedium;
  const cuda::GemmPrecision prec = cuda::ForPrecision(c.precision);
  const int64_t numel = c.rows * c.cols;
  const bool is_x = args.transpose;
  const int64_t m = is_x ? c.cols : c.rows, n = is_x ? c.rows : c.cols;
  // Normalize as the kernel does (fp32 division), into the row-major buffer the backend uploads.
  double sumsq = 0;
  for (double v : g) sumsq += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
  const float d = std::fmax(static_cast<float>(std::sqrt(sumsq)), static_cast<float>(args.eps));
  const size_t es = prec.element_size();
  std::vector<char> x0(numel * es), x1(numel * es), a(m * m * es), b(m * m * es);
  for (int64_t i = 0; i < numel; ++i) {
    const float v = static_cast<float>(g[i]) / d;
    if (medium) {
      reinterpret_cast<uint16_t*>(x0.data())[i] = FloatToBf16(v);
    } else {
      reinterpret_cast<float*>(x0.data())[i] = v;
    }
  }
  g_gemm_calls = 0;
  const cuda::NsDevice dev{nullptr, nullptr, prec};
  auto result =
      cuda::RunSchedule(dev, args.schedule, cuda::WorkMatrix{x0.data(), is_x, m, n}, x1.data(), a.data(), b.data());
  ASSERT_OK(result);
  EXPECT_EQ(g_gemm_calls, c.expected_gemms);
  std::vector<double> out(numel);
  for (int64_t i = 0; i < numel; ++i) {
    const float v =
        medium ? Bf16ToFloat(static_cast<const uint16_t*>(*result)[i]) : static_cast<const float*>(*result)[i];
    out[i] = static_cast<double>(v * static_cast<float>(args.scale));
  }
  const std::vector<double> ref = gpu_testing::ReferenceNs(g, c.rows, c.cols, args, medium);
  EXPECT_LT(gpu_testing::RelativeError(out, ref), medium ? 1e-2 : 1e-5);
}

// Strips: m = 1040 ≥ kSymmetricMinSize gives 2 strips per symmetric product, so one quintic
// step is 2 (Gram) + 2 (A·A) + 1 (update) GEMMs; below the threshold it is 1 + 1 + 1, and the
// c = 0 path skips A·A.
INSTANTIATE_TEST_SUITE_P(Cases, CudaLayoutEmulationTest,
                         ::testing::Values(LayoutCase{"wide_highest", 40, 72, Precision::kHighest, TransposeMode::kAuto,
                                                      CoefficientType::kQuintic, 5, 15},
                                           LayoutCase{"tall_highest", 72, 40, Precision::kHighest, TransposeMode::kAuto,
                                                      CoefficientType::kQuintic, 5, 15},
                                           LayoutCase{"tall_untransposed", 60, 30, Precision::kHighest,
                                                      TransposeMode::kOff, CoefficientType::kQuintic, 3, 9},
                                           LayoutCase{"wide_medium", 40, 72, Precision::kMedium, TransposeMode::kAuto,
                                                      CoefficientType::kQuintic, 5, 15},
                                           LayoutCase{"tall_medium_cubic", 72, 40, Precision::kMedium,
                                                      TransposeMode::kAuto, CoefficientType::kCubic5, 5, 10},
                                           LayoutCase{"strips_highest", 1040, 1060, Precision::kHighest,
                                                      TransposeMode::kAuto, CoefficientType::kQuintic, 1, 5},
                                           LayoutCase{"strips_medium_tall", 1060, 1040, Precision::kMedium,
                                                      TransposeMode::kAuto, CoefficientType::kQuintic, 1, 5}),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return info.param.name; });

}  // namespace
}  // namespace orthoserve
