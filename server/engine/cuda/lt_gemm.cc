// Implementation of server/engine/cuda/lt_gemm.h.
#include "server/engine/cuda/lt_gemm.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"

namespace orthoserve::cuda {
namespace {

bool FitsInt(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

absl::StatusOr<LtLayout> MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                    int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  RETURN_IF_ERROR(CublasCall(
      cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
      "cublasLtMatrixLayoutCreate"));
  LtLayout layout(raw);
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    RETURN_IF_ERROR(CublasCall(
        cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
        "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)"));
    RETURN_IF_ERROR(CublasCall(
        cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
        "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)"));
  }
  return layout;
}

// Stored (pre-op) shapes: A is m × k or k × m, B is k × n or n × k.
struct StoredShapes {
  int64_t a_rows, a_cols, b_rows, b_cols;
};

StoredShapes StoredShapesOf(const GemmProblem& g) {
  const bool ta = g.op_a != CUBLAS_OP_N, tb = g.op_b != CUBLAS_OP_N;
  return StoredShapes{ta ? g.k : g.m, ta ? g.m : g.k, tb ? g.n : g.k, tb ? g.k : g.n};
}

const char* Offset(const void* p, int64_t elements, size_t element_size) {
  return static_cast<const char*>(p) + elements * static_cast<int64_t>(element_size);
}

}  // namespace

LtGemm::Key LtGemm::InstanceKey(const GemmPrecision& p, const GemmProblem& g, size_t workspace_bytes) {
  return Key{static_cast<int64_t>(p.data_type), static_cast<int64_t>(p.compute), static_cast<int64_t>(g.op_a),
             static_cast<int64_t>(g.op_b), g.m, g.n, g.k, g.lda, g.ldb, g.ldc, static_cast<int64_t>(workspace_bytes)};
}

GemmPrecision ForPrecision(Precision precision) {
  switch (precision) {
    case Precision::kMedium:
      return GemmPrecision{DType::kBF16, CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    case Precision::kHigh:
      return GemmPrecision{DType::kF32, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    case Precision::kHighest:
      break;
  }
  return GemmPrecision{DType::kF32, CUDA_R_32F, CUBLAS_COMPUTE_32F};
}

absl::StatusOr<std::unique_ptr<LtGemm>> LtGemm::Create() {
  cublasLtHandle_t raw = nullptr;
  RETURN_IF_ERROR(CublasCall(cublasLtCreate(&raw), "cublasLtCreate"));
  return std::unique_ptr<LtGemm>(new LtGemm(LtHandle(raw)));
}

absl::StatusOr<const LtGemm::Plan*> LtGemm::PlanFor(const GemmPrecision& p, const GemmProblem& g,
                                                    size_t workspace_bytes) {
  const Key key = InstanceKey(p, g, workspace_bytes);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (!FitsInt(g.m) || !FitsInt(g.n) || !FitsInt(g.k) || !FitsInt(g.lda) || !FitsInt(g.ldb) || !FitsInt(g.ldc) ||
      !FitsInt(g.batch) || g.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM of ", g.m, "x", g.n, "x", g.k, " (batch ", g.batch,
                                                   ") exceeds cuBLASLt's 32-bit dimensions"));
  }

  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  RETURN_IF_ERROR(CublasCall(cublasLtMatmulDescCreate(&desc, p.compute, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  plan->desc = LtMatmulDesc(desc);
  const int32_t op_a = g.op_a, op_b = g.op_b;
  RETURN_IF_ERROR(CublasCall(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
                             "cublasLtMatmulDescSetAttribute(TRANSA)"));
  RETURN_IF_ERROR(CublasCall(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
                             "cublasLtMatmulDescSetAttribute(TRANSB)"));
  const StoredShapes z = StoredShapesOf(g);
  ASSIGN_OR_RETURN(plan->a, MakeLayout(p.data_type, z.a_rows, z.a_cols, g.lda, 1, 0));
  ASSIGN_OR_RETURN(plan->b, MakeLayout(p.data_type, z.b_rows, z.b_cols, g.ldb, 1, 0));
  ASSIGN_OR_RETURN(plan->c, MakeLayout(p.data_type, g.m, g.n, g.ldc, 1, 0));

  cublasLtMatmulPreference_t raw_pref = nullptr;
  RETURN_IF_ERROR(CublasCall(cublasLtMatmulPreferenceCreate(&raw_pref), "cublasLtMatmulPreferenceCreate"));
  LtPreference pref(raw_pref);
  const uint64_t max_workspace = workspace_bytes;
  RETURN_IF_ERROR(CublasCall(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                  &max_workspace, sizeof(max_workspace)),
                             "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)"));
  // Split-K partials in fp32 only: never reduced in (or through) the bf16 output.
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  RETURN_IF_ERROR(CublasCall(
      cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                           sizeof(schemes)),
      "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)"));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  RETURN_IF_ERROR(CublasCall(cublasLtMatmulAlgoGetHeuristic(handle_.get(), desc, plan->a.get(), plan->b.get(),
                                                            plan->c.get(), plan->c.get(), raw_pref, 1, &result,
                                                            &found),
                             "cublasLtMatmulAlgoGetHeuristic"));
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasLtMatmulAlgoGetHeuristic: no algorithm for a ", g.m, "x", g.n, "x",
                                            g.k, " product within ", workspace_bytes, " bytes of workspace"));
  }
  plan->algo = result.algo;
  if (plans_.size() >= kMaxPlans) {
    plans_.clear();
    batches_.clear();
  }
  const Plan* out = plan.get();
  plans_.emplace(key, std::move(plan));
  return out;
}

absl::StatusOr<const LtGemm::Batch*> LtGemm::BatchFor(const GemmPrecision& p, const GemmProblem& g, const Plan& plan,
                                                      size_t workspace_bytes) {
  const Key instance = InstanceKey(p, g, workspace_bytes);
  BatchKey key{};  // The instance's key, then the batch count and strides.
  std::copy(instance.begin(), instance.end(), key.begin());
  const size_t n = instance.size();
  key[n] = g.batch;
  key[n + 1] = g.stride_a;
  key[n + 2] = g.stride_b;
  key[n + 3] = g.stride_c;
  if (auto it = batches_.find(key); it != batches_.end()) return it->second.get();
  auto batch = std::make_unique<Batch>();
  const StoredShapes z = StoredShapesOf(g);
  ASSIGN_OR_RETURN(batch->a, MakeLayout(p.data_type, z.a_rows, z.a_cols, g.lda, g.batch, g.stride_a));
  ASSIGN_OR_RETURN(batch->b, MakeLayout(p.data_type, z.b_rows, z.b_cols, g.ldb, g.batch, g.stride_b));
  ASSIGN_OR_RETURN(batch->c, MakeLayout(p.data_type, g.m, g.n, g.ldc, g.batch, g.stride_c));
  // A split-K algorithm sums K in parts whose scheduling may depend on the whole grid, batch
  // included; its instances run one by one — identical calls, identical bits.
  int32_t splits = 1;
  size_t written = 0;
  const bool split_k = cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                            sizeof(splits), &written) != CUBLAS_STATUS_SUCCESS ||
                       splits > 1;
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t s = cublasLtMatmulAlgoCheck(handle_.get(), plan.desc.get(), batch->a.get(), batch->b.get(),
                                                   batch->c.get(), batch->c.get(), &plan.algo, &check);
  batch->batched = !split_k && s == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= workspace_bytes;
  const Batch* out = batch.get();
  batches_.emplace(key, std::move(batch));
  return out;
}

absl::Status LtGemm::Run(const GemmPrecision& p, const GemmProblem& g, const GemmOperands& o, const Workspace& ws,
                         cudaStream_t stream) {
  if (o.c == nullptr && o.beta != 0.0f) return absl::InvalidArgumentError("GEMM with beta != 0 needs a C operand");
  ASSIGN_OR_RETURN(const Plan* plan, PlanFor(p, g, ws.bytes));
  const void* c = o.c != nullptr ? o.c : o.d;
  const Batch* batch = nullptr;
  if (g.batch > 1) {
    ASSIGN_OR_RETURN(batch, BatchFor(p, g, *plan, ws.bytes));
  }
  if (g.batch == 1 || batch->batched) {
    const LtLayout& a = batch != nullptr ? batch->a : plan->a;
    const LtLayout& b = batch != nullptr ? batch->b : plan->b;
    const LtLayout& cd = batch != nullptr ? batch->c : plan->c;
    return CublasCall(cublasLtMatmul(handle_.get(), plan->desc.get(), &o.alpha, o.a, a.get(), o.b, b.get(), &o.beta,
                                     c, cd.get(), o.d, cd.get(), &plan->algo, ws.data, ws.bytes, stream),
                      "cublasLtMatmul");
  }
  const size_t es = p.element_size();
  for (int64_t i = 0; i < g.batch; ++i) {
    RETURN_IF_ERROR(CublasCall(
        cublasLtMatmul(handle_.get(), plan->desc.get(), &o.alpha, Offset(o.a, i * g.stride_a, es), plan->a.get(),
                       Offset(o.b, i * g.stride_b, es), plan->b.get(), &o.beta, Offset(c, i * g.stride_c, es),
                       plan->c.get(), const_cast<char*>(Offset(o.d, i * g.stride_c, es)), plan->c.get(), &plan->algo,
                       ws.data, ws.bytes, stream),
        "cublasLtMatmul"));
  }
  return absl::OkStatus();
}

}  // namespace orthoserve::cuda
