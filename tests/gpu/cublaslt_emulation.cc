// Implementation of tests/gpu/cublaslt_emulation.h.
#include "tests/gpu/cublaslt_emulation.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "common/dtype.h"
#include "server/engine/cuda/kernels.h"

namespace orthoserve::gpu_emulation {
Emulation g;
}  // namespace orthoserve::gpu_emulation

namespace {

using orthoserve::gpu_emulation::g;
// Guards `g`: ranks of an emulated fleet run the backend on several threads at once.
std::mutex g_mu;
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
  std::lock_guard<std::mutex> lock(g_mu);
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
  std::unique_lock<std::mutex> lock(g_mu);
  ++g.matmul_calls;
  if (g.matmul_calls == g.fail_call) return CUBLAS_STATUS_EXECUTION_FAILED;
  g.streams.insert(stream);
  if (g.main != nullptr && stream != g.main) {
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
  lock.unlock();  // The arithmetic touches only the call's own buffers.
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
  std::lock_guard<std::mutex> lock(g_mu);
  if (g.main == nullptr) return cudaSuccess;
  if (event == g.fork) {
    if (stream != g.main) g.errors.push_back("fork recorded on a side stream");
    ++g.fork_epoch;
  }
  g.recorded[event] = stream;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g.main == nullptr) return cudaSuccess;
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
  *count = g.device_count;
  return cudaSuccess;
}
}

namespace orthoserve::cuda {
// Host version of the mirror kernel (kernels.cu is not linked). It must run on the main stream
// after every side stream was joined back.
cudaError_t MirrorUpper(DType dtype, void* base, int64_t m, int64_t ld, int64_t batch, int64_t stride,
                        cudaStream_t stream) {
  if (g.main != nullptr) {
    if (stream != g.main) g.errors.push_back("mirror not on the main stream");
    for (const auto& [side, pending] : g.unjoined) {
      if (pending) g.errors.push_back("mirror ran before a side stream was joined");
    }
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
