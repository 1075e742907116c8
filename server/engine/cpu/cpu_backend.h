// The CPU Backend: Newton–Schulz on OpenBLAS (sgemm, ssyrk) in fp32, with bf16 emulation for
// MEDIUM precision, for whole matrices (Run) and TP_DISTRIBUTED shards (RunSharded).
//
// Arithmetic (docs/numerics.md has the whole of it): inputs are widened to fp32 and put in the
// wide orientation; the sum of squares accumulates in double, the divisor max(‖X‖_F, eps) or
// ‖X‖_F + eps is rounded once to fp32 and X is divided by it in fp32. Each step forms
// A = X·Xᵀ (ssyrk, one triangle mirrored), B = b·A + c·A·A (ssyrk of the symmetric A with the
// b·A term added to its fp32 output), X = a·X + B·X (sgemm with a·X added to its fp32 output);
// when c = 0, X = a·X + b·(A·X). kHighest and kHigh are the same fp32 computation. kMedium
// rounds X to bf16 after normalization and rounds A, B and the new X to bf16 once each, after
// their fp32 accumulation — the operands of every product are therefore bf16 values, so the
// fp32 BLAS products of them are bf16-operand, fp32-accumulate products. The result is
// transposed back, multiplied by `scale` (exact product in double, rounded to fp32) and
// narrowed to the output dtype. Coefficients are used as fp32 values, as torch.addmm does.
//
// Threads and OpenBLAS. Debian 12's OpenBLAS 0.3.21 (pthread build) keeps its thread count in
// one process-wide variable: openblas_set_num_threads changes it for every caller (0.3.21 has
// no per-call setting), changing it while another thread is inside a BLAS call is a data race,
// and multithreaded level-3 calls from several threads queue on one lock inside the library.
// So Create pins OpenBLAS to one thread for the whole process (once; every CpuBackend asks for
// the same value) and the backend splits each product itself into `threads` parts — row blocks
// of the Gram's triangle, column slices of B·X — each a single-threaded BLAS call that runs in
// the calling or a worker thread. Single-threaded OpenBLAS calls are reentrant (its buffer
// allocator is locked), so Run and RunSharded may be called concurrently from any number of
// threads. Anything else in the process that uses OpenBLAS also runs single-threaded.
//
// Determinism: for a fixed `threads`, the split of every product depends only on the shapes,
// so a task gives the same bits alone, inside any batch, or concurrently with other calls.
// Different `threads` values may differ in the last bits (different BLAS call shapes).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/engine/cpu/parallel_for.h"

namespace orthoserve {

class CpuBackend final : public Backend {
 public:
  struct Options {
    int threads = 1;  // BLAS threads per product (1..256): the parts each product is split into.
  };

  // INVALID_ARGUMENT when threads is outside 1..256.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const Options& options);

  BackendInfo Info() const override;

  // Tasks run one after another, each with `threads` threads per product. Per-task codes:
  // INVALID_ARGUMENT (null args/in/out, a non-positive shape, a NaN or Inf in the input),
  // RESOURCE_EXHAUSTED (buffers that cannot be allocated).
  std::vector<absl::Status> Run(absl::Span<const NsTask> tasks) override;

  // INVALID_ARGUMENT for null args, partition_dim not 0 or 1, gram_size <= 0, a shard with null
  // buffers, a non-positive shape, or a shape whose unsharded dim is not gram_size; these are
  // found before the first reduction, so every participant must pass the same checks (the
  // distributed layer validates specs identically on every rank). Otherwise the reducer's
  // error, or RESOURCE_EXHAUSTED.
  absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer) override;

  // True: the sum of squares of docs/numerics.md §2 is finite exactly when every element is, and
  // a task stops when it is not (ns_loop.h CheckSumOfSquares).
  bool FailsNonFiniteInput() const override { return true; }

 private:
  explicit CpuBackend(const Options& options);

  absl::Status RunOne(const NsTask& task);

  const Options options_;
  std::unique_ptr<ParallelFor> pool_;
};

}  // namespace orthoserve
