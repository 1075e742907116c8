// The Newton–Schulz step loop on device buffers, shared by the whole-matrix and the sharded
// paths of the CUDA backend.
//
// Layout. A row-major rows × cols matrix in device memory is, read column-major, its own
// transpose. With X the wide working matrix (m × n), the buffer therefore holds X itself
// (`is_x`, the transposed case: X = Gᵀ) or Xᵀ (X = G); every product picks its cuBLAS op flags
// from that, so nothing is ever transposed explicitly. Calls enqueue on `stream`.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ns_options.h"
#include "server/engine/cuda/products.h"

namespace orthoserve::cuda {

struct NsDevice {
  cublasHandle_t blas = nullptr;  // Bound to `stream`.
  cudaStream_t stream = nullptr;
  GemmPrecision precision;
};

// A working matrix X of m × n held as described above.
struct WorkMatrix {
  void* data = nullptr;
  bool is_x = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t ld() const { return is_x ? m : n; }
  int64_t numel() const { return m * n; }
};

// a (m × m) = X·Xᵀ, exactly symmetric.
absl::Status Gram(const NsDevice& dev, const WorkMatrix& x, void* a);

// From the Gram `a` (m × m): B = b·A + c·A·A into `b_buf` (skipped when c = 0), then
// x_next = a·X + B·X (or a·X + b·(A·X) when c = 0), each as one GEMM whose beta epilogue
// accumulates into the output: one rounding per output element. `x_next` has x's layout.
absl::Status Update(const NsDevice& dev, const CoefficientTriple& t, const void* a, void* b_buf, const WorkMatrix& x,
                    void* x_next);

// Runs every step of `schedule` on x (in `x0`), ping-ponging with `x1`, with scratch `a` and
// `b` of m × m. Returns the buffer holding the result (x0 or x1).
absl::StatusOr<void*> RunSchedule(const NsDevice& dev, const std::vector<CoefficientTriple>& schedule, WorkMatrix x,
                                  void* x1, void* a, void* b);

}  // namespace orthoserve::cuda
