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

namespace {

// What the emulation saw.
struct Emulation {
  int64_t matmul_calls = 0;
  int64_t batched_calls = 0;        // Calls with a batch count > 1.
  bool refuse_batched = false;      // cublasLtMatmulAlgoCheck refuses strided batches.
  int64_t fail_call = 0;            // cublasLtMatmul call number (1-based) that fails; 0: none.
  int32_t split_k = 1;              // SPLITK_NUM of the algorithms the heuristic hands out.
  std::set<cudaStream_t> streams;   // Streams a product ran on.
  std::vector<std::string> errors;  // Contract violations.
  // Stream protocol.
  cudaStream_t main = nullptr;
  cudaEvent_t fork = nullptr;
  int64_t fork_epoch = 0;
  std::map<cudaStream_t, int64_t> waited_epoch;  // Fork epoch each side stream last waited on.
  std::map<cudaStream_t, bool> unjoined;         // Side stream forked and not yet joined back.
  std::map<cudaEvent_t, cudaStream_t> recorded;  // Event → stream it was last recorded on.
};
Emulation g;

struct FakeDesc {
  int64_t compute, trans_a, trans_b;
};
struct FakeLayout {
  int64_t type, rows, cols, ld, batch, stride;
};
static_assert(sizeof(FakeDesc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(FakeLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t));

FakeDesc& D(cublasLtMatmulDesc_t d) { return *reinterpret_cast<FakeDesc*>(d->data); }
FakeLayout& L(cublasLtMatrixLayout_t l) { return *reinterpret_cast<FakeLayout*>(l->data); }

float Load(int64_t t, const void* p, int64_t i) {
  if (t == CUDA_R_16BF) return orthoserve::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void Store(int64_t t, void* p, int64_t i, float v) {
  if (t == CUDA_R_16BF) {
    static_cast<uint16_t*>(p)[i] = orthoserve::FloatToBf16(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// The algorithm id the emulated heuristic hands out: a function of the single-instance problem.
uint64_t AlgoId(const FakeDesc& d, const FakeLayout& a, const FakeLayout& b, const FakeLayout& c) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : {d.compute, d.trans_a, d.trans_b, a.type, a.rows, a.cols, a.ld, b.rows, b.cols, b.ld, c.rows,
                    c.cols, c.ld}) {
    h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  }
  return h;
}

const char* At(const void* p, int64_t elements, int64_t type) {
  return static_cast<const char*>(p) + elements * (type == CUDA_R_16BF ? 2 : 4);
}

}  // namespace

// The emulated entry points (the test binary links neither libcudart nor libcublasLt).
extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  static int token;
  *handle = reinterpret_cast<cublasLtHandle_t>(&token);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t) {
  *desc = new cublasLtMatmulDescOpaque_t{};
  D(*desc) = FakeDesc{compute, CUBLAS_OP_N, CUBLAS_OP_N};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  const int32_t v = *static_cast<const int32_t*>(buf);
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA) D(desc).trans_a = v;
  else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) D(desc).trans_b = v;
  else return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{};
  L(*layout) = FakeLayout{type, static_cast<int64_t>(rows), static_cast<int64_t>(cols), ld, 1, 0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) {
    L(layout).batch = *static_cast<const int32_t*>(buf);
  } else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) {
    L(layout).stride = *static_cast<const int64_t*>(buf);
  } else {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}
// Preference data: [0] max workspace, [1] allowed reduction schemes (cuBLASLt's default: all).
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  (*pref)->data[1] = CUBLASLT_REDUCTION_SCHEME_MASK;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t)) {
    pref->data[0] = *static_cast<const uint64_t*>(buf);
  } else if (attr == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && size == sizeof(uint32_t)) {
    pref->data[1] = *static_cast<const uint32_t*>(buf);
  } else {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* found) {
  if ((pref->data[1] & (CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)) != 0) {
    g.errors.push_back("split-K partials may be reduced in the output type (a second rounding in bf16)");
  }
  if (pref->data[0] == 0) g.errors.push_back("no workspace limit given to the heuristic");
  if (L(a).batch != 1 || L(b).batch != 1 || L(c).batch != 1) {
    g.errors.push_back("the heuristic was asked about a batched problem (the algorithm must not depend on the batch)");
  }
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = AlgoId(D(desc), L(a), L(b), L(c));
  results[0].algo.data[1] = static_cast<uint64_t>(g.split_k);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                       const cublasLtMatmulAlgo_t*, cublasLtMatmulHeuristicResult_t* result) {
  *result = cublasLtMatmulHeuristicResult_t{};
  return g.refuse_batched ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t adesc, const void* b, cublasLtMatrixLayout_t bdesc,
                              const void* beta, const void* c, cublasLtMatrixLayout_t cdesc, void* d,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo, void*, size_t,
                              cudaStream_t stream) {
  ++g.matmul_calls;
  if (g.matmul_calls == g.fail_call) return CUBLAS_STATUS_EXECUTION_FAILED;
  g.streams.insert(stream);
  if (stream != g.main) {
    if (g.waited_epoch[stream] != g.fork_epoch) g.errors.push_back("a side stream ran a product before the fork");
    g.unjoined[stream] = true;
  }
  const FakeDesc& op = D(desc);
  FakeLayout la = L(adesc), lb = L(bdesc), lc = L(cdesc), ld = L(ddesc);
  if (std::memcmp(&lc, &ld, sizeof(lc)) != 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int64_t batch = ld.batch;
  if (la.batch != batch || lb.batch != batch) return CUBLAS_STATUS_INVALID_VALUE;
  if (batch > 1) ++g.batched_calls;
  FakeLayout a1 = la, b1 = lb, c1 = lc;
  a1.batch = b1.batch = c1.batch = 1;
  a1.stride = b1.stride = c1.stride = 0;
  if (algo->data[0] != AlgoId(op, a1, b1, c1)) g.errors.push_back("product run with another problem's algorithm");
  const bool ta = op.trans_a != CUBLAS_OP_N, tb = op.trans_b != CUBLAS_OP_N;
  const int64_t m = ld.rows, n = ld.cols, k = ta ? la.rows : la.cols;
  if ((ta ? la.cols : la.rows) != m || (tb ? lb.rows : lb.cols) != n || (tb ? lb.cols : lb.rows) != k ||
      la.ld < std::max<int64_t>(1, la.rows) || lb.ld < std::max<int64_t>(1, lb.rows) ||
      ld.ld < std::max<int64_t>(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  for (int64_t inst = 0; inst < batch; ++inst) {
    const void* ai = At(a, inst * la.stride, la.type);
    const void* bi = At(b, inst * lb.stride, lb.type);
    const void* ci = At(c, inst * lc.stride, lc.type);
    void* di = const_cast<char*>(At(d, inst * ld.stride, ld.type));
    // op(A) as an m × k row-major float array, op(B) as k × n.
    std::vector<float> oa(static_cast<size_t>(m * k)), ob(static_cast<size_t>(k * n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < k; ++p) oa[i * k + p] = ta ? Load(la.type, ai, p + i * la.ld) : Load(la.type, ai, i + p * la.ld);
    }
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < n; ++j) ob[p * n + j] = tb ? Load(lb.type, bi, j + p * lb.ld) : Load(lb.type, bi, p + j * lb.ld);
    }
    std::vector<float> acc(static_cast<size_t>(n));
    std::vector<float> out(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t p = 0; p < k; ++p) {
        const float x = oa[i * k + p];
        const float* row = &ob[p * n];
        for (int64_t j = 0; j < n; ++j) acc[j] += x * row[j];
      }
      for (int64_t j = 0; j < n; ++j) {
        out[i * n + j] = al * acc[j] + (be == 0.0f ? 0.0f : be * Load(lc.type, ci, i + j * lc.ld));
      }
    }
    // Written after every read, so C may be D.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) Store(ld.type, di, i + j * ld.ld, out[i * n + j]);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf, size_t size,
                                                    size_t* written) {
  if (attr != CUBLASLT_ALGO_CONFIG_SPLITK_NUM || size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  *static_cast<int32_t*>(buf) = static_cast<int32_t>(algo->data[1]);
  *written = sizeof(int32_t);
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMULATED"; }
const char* cublasLtGetStatusString(cublasStatus_t) { return "emulated"; }
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == g.fork) {
    if (stream != g.main) g.errors.push_back("fork recorded on a side stream");
    ++g.fork_epoch;
  }
  g.recorded[event] = stream;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == g.fork) {
    g.waited_epoch[stream] = g.fork_epoch;
    g.unjoined[stream] = true;
  } else if (stream == g.main) {
    g.unjoined[g.recorded[event]] = false;
  }
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
// Host version of the mirror kernel (kernels.cu is not linked). It must run on the main stream
// after every side stream was joined back.
cudaError_t MirrorUpper(DType dtype, void* base, int64_t m, int64_t ld, int64_t batch, int64_t stride,
                        cudaStream_t stream) {
  if (stream != g.main) g.errors.push_back("mirror not on the main stream");
  for (const auto& [side, pending] : g.unjoined) {
    if (pending) g.errors.push_back("mirror ran before a side stream was joined");
  }
  const size_t es = ElementSize(dtype);
  for (int64_t j = 0; j < batch; ++j) {
    char* c = static_cast<char*>(base) + j * stride * static_cast<int64_t>(es);
    for (int64_t col = 0; col < m; ++col) {
      for (int64_t row = col + 1; row < m; ++row) {
        std::memcpy(c + (row + col * ld) * es, c + (col + row * ld) * es, es);
      }
    }
  }
  return cudaSuccess;
}
}  // namespace orthoserve::cuda

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
