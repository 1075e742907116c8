// Implementation of server/engine/cuda/ns_steps.h.
#include "server/engine/cuda/ns_steps.h"

#include <utility>

#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"

namespace orthoserve::cuda {

absl::Status Gram(const NsDevice& dev, const WorkMatrix& x, void* a) {
  return SymmetricProduct(dev.blas, dev.stream, dev.precision, x.data, /*stored_transposed=*/!x.is_x, x.m, x.n, x.ld(),
                          1.0f, 0.0f, a, x.m);
}

absl::Status Update(const NsDevice& dev, const CoefficientTriple& t, const void* a, void* b_buf, const WorkMatrix& x,
                    void* x_next) {
  const size_t es = dev.precision.element_size();
  const int64_t m = x.m;
  const void* mult = a;  // The m × m left factor: B, or A when c = 0.
  float alpha = static_cast<float>(t.b);
  if (t.c != 0) {
    // B = c·(A·A) + b·A with A symmetric, so A·A = A·Aᵀ (a symmetric product).
    RETURN_IF_ERROR(
        CudaCall(cudaMemcpyAsync(b_buf, a, static_cast<size_t>(m * m) * es, cudaMemcpyDeviceToDevice, dev.stream),
                 "cudaMemcpyAsync"));
    RETURN_IF_ERROR(SymmetricProduct(dev.blas, dev.stream, dev.precision, a, false, m, m, m, static_cast<float>(t.c),
                                     static_cast<float>(t.b), b_buf, m));
    mult = b_buf;
    alpha = 1.0f;
  }
  // x_next starts as X so the GEMM's beta = a adds a·X before the single rounding.
  RETURN_IF_ERROR(CudaCall(
      cudaMemcpyAsync(x_next, x.data, static_cast<size_t>(x.numel()) * es, cudaMemcpyDeviceToDevice, dev.stream),
      "cudaMemcpyAsync"));
  const float beta = static_cast<float>(t.a);
  if (x.is_x) {
    // X' = a·X + M·X: (m × m)(m × n).
    return Gemm(dev.blas, dev.precision, CUBLAS_OP_N, CUBLAS_OP_N, m, x.n, m, alpha, mult, m, x.data, m, beta, x_next,
                m);
  }
  // Xᵀ' = a·Xᵀ + Xᵀ·Mᵀ = a·Xᵀ + Xᵀ·M (M symmetric): (n × m)(m × m).
  return Gemm(dev.blas, dev.precision, CUBLAS_OP_N, CUBLAS_OP_N, x.n, m, m, alpha, x.data, x.n, mult, m, beta, x_next,
              x.n);
}

absl::StatusOr<void*> RunSchedule(const NsDevice& dev, const std::vector<CoefficientTriple>& schedule, WorkMatrix x,
                                  void* x1, void* a, void* b) {
  void* next = x1;
  for (const CoefficientTriple& t : schedule) {
    RETURN_IF_ERROR(Gram(dev, x, a));
    RETURN_IF_ERROR(Update(dev, t, a, b, x, next));
    std::swap(x.data, next);
  }
  return x.data;
}

}  // namespace orthoserve::cuda
