// The Newton–Schulz step loop on device buffers, shared by the whole-matrix and the sharded
// paths of the CUDA backend.
//
// Layout. A row-major rows × cols matrix in device memory is, read column-major, its own
// transpose. With X the wide working matrix (m × n), the buffer therefore holds X itself
// (`is_x`, the transposed case: X = Gᵀ) or Xᵀ (X = G); every product picks its op flags from
// that, so nothing is ever transposed explicitly. A WorkMatrix may hold `batch` same-shape
// matrices back to back (X_j at j·m·n); the m × m scratch (A, B) then holds `batch` m × m
// matrices likewise. Calls enqueue on the device's main stream (products may fan out, see
// products.h) and return without waiting.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ns_options.h"
#include "server/engine/cuda/products.h"

namespace orthoserve::cuda {

// `batch` working matrices X of m × n each, held as described above.
struct WorkMatrix {
  void* data = nullptr;
  bool is_x = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t batch = 1;
  int64_t ld() const { return is_x ? m : n; }
  int64_t numel() const { return m * n; }  // Of one matrix.
};

// a (m × m per matrix) = X·Xᵀ, exactly symmetric.
absl::Status Gram(const BlasDevice& dev, const WorkMatrix& x, void* a);

// The m × m left factor M of a step's update X' = a·X + alpha·M·X: B = b·A + c·A·A (one product
// whose epilogue adds b·A before the single rounding) written to `b_buf`, with alpha = 1; or,
// when c = 0, A itself with alpha = b (no product).
struct Multiplier {
  const void* data = nullptr;  // `batch` m × m matrices.
  float alpha = 1.0f;
};
absl::StatusOr<Multiplier> MakeMultiplier(const BlasDevice& dev, const CoefficientTriple& t, const void* a,
                                          void* b_buf, int64_t m, int64_t batch);

// x_next = a·X + alpha·M·X as one product whose epilogue adds a·X before the single rounding per
// output. `x_next` has x's layout; M has x's batch.
absl::Status ApplyMultiplier(const BlasDevice& dev, const CoefficientTriple& t, const Multiplier& mult,
                             const WorkMatrix& x, void* x_next);

// One step's update from the Gram `a`: MakeMultiplier, then ApplyMultiplier.
absl::Status Update(const BlasDevice& dev, const CoefficientTriple& t, const void* a, void* b_buf,
                    const WorkMatrix& x, void* x_next);

// Runs every step of `schedule` on x (in x.data), ping-ponging with `x1`, with scratch `a` and `b`
// (m × m per matrix). Returns the buffer holding the result (x.data or x1).
absl::StatusOr<void*> RunSchedule(const BlasDevice& dev, const std::vector<CoefficientTriple>& schedule, WorkMatrix x,
                                  void* x1, void* a, void* b);

}  // namespace orthoserve::cuda
