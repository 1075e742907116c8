// LtGemm: every matrix product of the CUDA backend, through cuBLASLt.
//
//   D = alpha·op(A)·op(B) + beta·C   for each of `batch` same-shape instances at fixed strides,
//
// with C and D separate buffers, so the Newton–Schulz epilogues (b·A + c·A·A, a·X + B·X) need no
// copy of C into D first. Every buffer is column-major device memory; C and D share a layout.
//
// Precision (GemmPrecision): HIGHEST = fp32 operands, CUBLAS_COMPUTE_32F (no TF32); HIGH = fp32
// operands, CUBLAS_COMPUTE_32F_FAST_TF32; MEDIUM = bf16 A/B/C/D with CUBLAS_COMPUTE_32F: the
// product and beta·C are formed in fp32 and rounded once to bf16 (the contract's single fused
// rounding per output element).
//
// Split-K partial sums are kept in fp32 (the reduction schemes that would round them to the
// output type, bf16 in MEDIUM, are excluded), so the single rounding holds for every algorithm.
//
// Batch independence. The algorithm (kernel, tiles, split-K, ...) is chosen once per problem
// *without* its batch count — by the heuristic for one instance, cached under the instance's
// key — and reused for every batch count, so an instance is meant to get the same bits whether
// it runs alone or in a batch of 64 (cuBLASLt documents bitwise reproducibility only for
// identical calls; tests/gpu checks this property on the device). When that algorithm splits K
// (its partial sums might be scheduled by the whole grid, batch included) or cannot run the
// strided batch (cublasLtMatmulAlgoCheck says so), the instances run one after another with it
// instead — identical calls, identical bits, more launches.
//
// Thread-compatible: one LtGemm per context; calls enqueue on the given stream and return
// without waiting. Errors: INVALID_ARGUMENT for a dimension beyond cuBLASLt's 32-bit sizes,
// INTERNAL "cublasLtMatmul: CUBLAS_STATUS_...: ..." for library failures and when no algorithm
// fits the workspace.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "server/engine/cuda/cuda_handles.h"

namespace orthoserve::cuda {

struct GemmPrecision {
  DType dtype = DType::kF32;  // Element type of every operand (kF32 or kBF16).
  cudaDataType_t data_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  size_t element_size() const { return ElementSize(dtype); }
};

GemmPrecision ForPrecision(Precision precision);

// One product's shape. D is m × n, op(A) m × k, op(B) k × n; strides (in elements) step from one
// batch instance to the next (C and D alike).
struct GemmProblem {
  cublasOperation_t op_a = CUBLAS_OP_N;
  cublasOperation_t op_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Where a product reads and writes. `c` may be null only when beta is 0.
struct GemmOperands {
  float alpha = 1.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  float beta = 0.0f;
  const void* c = nullptr;
  void* d = nullptr;
};

// Device scratch cuBLASLt may use for one product at a time (one per stream).
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

class LtGemm {
 public:
  static absl::StatusOr<std::unique_ptr<LtGemm>> Create();

  absl::Status Run(const GemmPrecision& precision, const GemmProblem& problem, const GemmOperands& operands,
                   const Workspace& workspace, cudaStream_t stream);

  // Single-instance problems planned so far (each with its descriptors and algorithm).
  size_t plan_count() const { return plans_.size(); }

 private:
  // One instance's problem: the operation, its layouts and the algorithm, shared by every batch.
  struct Plan {
    LtMatmulDesc desc;
    LtLayout a, b, c;
    cublasLtMatmulAlgo_t algo{};
  };
  // The layouts of one batch count and strides, for a plan.
  struct Batch {
    LtLayout a, b, c;
    bool batched = false;  // The plan's algorithm runs the strided batch in one call.
  };
  using Key = std::array<int64_t, 11>;       // Precision, ops, sizes, leading dims, workspace.
  using BatchKey = std::array<int64_t, 15>;  // Key + batch and strides.
  static constexpr size_t kMaxPlans = 4096;  // A server sees few shapes; this bounds a pathological mix.

  explicit LtGemm(LtHandle handle) : handle_(std::move(handle)) {}
  static Key InstanceKey(const GemmPrecision& precision, const GemmProblem& problem, size_t workspace_bytes);
  absl::StatusOr<const Plan*> PlanFor(const GemmPrecision& precision, const GemmProblem& problem,
                                      size_t workspace_bytes);
  absl::StatusOr<const Batch*> BatchFor(const GemmPrecision& precision, const GemmProblem& problem, const Plan& plan,
                                        size_t workspace_bytes);

  LtHandle handle_;
  absl::flat_hash_map<Key, std::unique_ptr<Plan>> plans_;
  absl::flat_hash_map<BatchKey, std::unique_ptr<Batch>> batches_;  // Cleared with plans_.
};

}  // namespace orthoserve::cuda
