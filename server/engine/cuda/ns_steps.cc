// Implementation of server/engine/cuda/ns_steps.h.
#include "server/engine/cuda/ns_steps.h"

#include <utility>

#include "common/status.h"

namespace orthoserve::cuda {

absl::Status Gram(const BlasDevice& dev, const WorkMatrix& x, void* a) {
  SymmetricProblem p;
  p.p = x.data;
  p.stored_transposed = !x.is_x;
  p.m = x.m;
  p.k = x.n;
  p.ld = x.ld();
  p.batch = x.batch;
  p.stride_p = x.numel();
  p.d = a;
  p.ldd = x.m;
  p.stride_d = x.m * x.m;
  return SymmetricProduct(dev, p);
}

absl::StatusOr<Multiplier> MakeMultiplier(const BlasDevice& dev, const CoefficientTriple& t, const void* a,
                                          void* b_buf, int64_t m, int64_t batch) {
  if (t.c == 0) return Multiplier{a, static_cast<float>(t.b)};
  // B = c·(A·A) + b·A with A symmetric, so A·A = A·Aᵀ (a symmetric product with C = A).
  SymmetricProblem p;
  p.p = a;
  p.m = m;
  p.k = m;
  p.ld = m;
  p.batch = batch;
  p.stride_p = m * m;
  p.alpha = static_cast<float>(t.c);
  p.beta = static_cast<float>(t.b);
  p.c = a;
  p.d = b_buf;
  p.ldd = m;
  p.stride_d = m * m;
  RETURN_IF_ERROR(SymmetricProduct(dev, p));
  return Multiplier{b_buf, 1.0f};
}

absl::Status ApplyMultiplier(const BlasDevice& dev, const CoefficientTriple& t, const Multiplier& mult,
                             const WorkMatrix& x, void* x_next) {
  const int64_t m = x.m, mm = m * m;
  // x_next = a·X + alpha·M·X: C = X, D = x_next.
  GemmOperands o{mult.alpha, nullptr, nullptr, static_cast<float>(t.a), x.data, x_next};
  if (x.is_x) {
    // X' = a·X + M·X: (m × m)(m × n).
    o.a = mult.data;
    o.b = x.data;
    return Gemm(dev, GemmProblem{CUBLAS_OP_N, CUBLAS_OP_N, m, x.n, m, m, m, m, x.batch, mm, x.numel(), x.numel()}, o);
  }
  // Xᵀ' = a·Xᵀ + Xᵀ·Mᵀ = a·Xᵀ + Xᵀ·M (M symmetric): (n × m)(m × m).
  o.a = x.data;
  o.b = mult.data;
  return Gemm(dev, GemmProblem{CUBLAS_OP_N, CUBLAS_OP_N, x.n, m, m, x.n, m, x.n, x.batch, x.numel(), mm, x.numel()},
              o);
}

absl::Status Update(const BlasDevice& dev, const CoefficientTriple& t, const void* a, void* b_buf,
                    const WorkMatrix& x, void* x_next) {
  ASSIGN_OR_RETURN(const Multiplier mult, MakeMultiplier(dev, t, a, b_buf, x.m, x.batch));
  return ApplyMultiplier(dev, t, mult, x, x_next);
}

absl::StatusOr<void*> RunSchedule(const BlasDevice& dev, const std::vector<CoefficientTriple>& schedule, WorkMatrix x,
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
