// Implementation of server/engine/cuda/products.h.
#include "server/engine/cuda/products.h"

#include <algorithm>

#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"
#include "server/engine/cuda/kernels.h"

namespace orthoserve::cuda {
namespace {

const char* Offset(const void* p, int64_t elements, size_t element_size) {
  return static_cast<const char*>(p) + elements * static_cast<int64_t>(element_size);
}

// The lane of strip i of `count` over `lanes` lanes, back and forth (0, 1, 2, 3, 3, 2, 1, 0, ...):
// strips shrink from first to last, so this pairs a large one with a small one on every lane.
size_t LaneOf(size_t i, size_t lanes) {
  const size_t phase = i % (2 * lanes);
  return phase < lanes ? phase : 2 * lanes - 1 - phase;
}

// Joins the side lanes forked so far back into the main one when it goes out of scope, also on
// an error path: the main stream then orders everything, and a stream capture stays joined.
class JoinLanes {
 public:
  explicit JoinLanes(const BlasDevice& dev) : dev_(dev) {}
  ~JoinLanes() { (void)Join(); }
  void Forked(size_t lanes) { forked_ = lanes; }
  absl::Status Join() {
    absl::Status status;
    for (size_t l = 1; l < forked_; ++l) {
      const Lane& lane = dev_.side[l - 1];
      if (status.ok()) status = CudaCall(cudaEventRecord(lane.done, lane.stream), "cudaEventRecord(join)");
      if (status.ok()) status = CudaCall(cudaStreamWaitEvent(dev_.main.stream, lane.done, 0), "cudaStreamWaitEvent(join)");
    }
    forked_ = 0;
    return status;
  }

 private:
  const BlasDevice& dev_;
  size_t forked_ = 0;
};

}  // namespace

absl::Status Gemm(const BlasDevice& dev, const GemmProblem& problem, const GemmOperands& operands) {
  return dev.lt->Run(dev.precision, problem, operands, dev.main.workspace, dev.main.stream);
}

std::vector<int64_t> SymmetricStrips(int64_t m, int64_t min_size) {
  // Strips of 1/8 of m (rounded up to 128 rows, at least 512): the upper triangle plus the
  // diagonal blocks cost (S+1)/(2S) of the full product, 56% for S = 8.
  const int64_t count = std::min<int64_t>(8, m / 512);
  if (m < min_size || count < 2) return {0, m};
  int64_t height = (m + count - 1) / count;
  height = (height + 127) / 128 * 128;
  std::vector<int64_t> starts;
  for (int64_t r0 = 0; r0 < m; r0 += height) starts.push_back(r0);
  starts.push_back(m);
  return starts;
}

absl::Status SymmetricProduct(const BlasDevice& dev, const SymmetricProblem& s) {
  const size_t es = dev.precision.element_size();
  // P rows [r0, ...) as the left operand and Pᵀ columns [r0, ...) as the right one.
  const cublasOperation_t op_left = s.stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_right = s.stored_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;
  auto rows_from = [&](int64_t r0) { return Offset(s.p, s.stored_transposed ? r0 * s.ld : r0, es); };
  auto block_at = [&](const void* base, int64_t r0) { return base == nullptr ? nullptr : Offset(base, r0 + r0 * s.ldd, es); };

  const std::vector<int64_t> strips = SymmetricStrips(s.m, dev.symmetric_min_size);
  const size_t count = strips.size() - 1;
  // Lanes: the main one first, then as many side lanes as there are further strips.
  const size_t lanes = std::min(count, 1 + dev.side.size());
  JoinLanes join(dev);
  if (lanes > 1) {
    RETURN_IF_ERROR(CudaCall(cudaEventRecord(dev.fork, dev.main.stream), "cudaEventRecord(fork)"));
    for (size_t l = 1; l < lanes; ++l) {
      RETURN_IF_ERROR(
          CudaCall(cudaStreamWaitEvent(dev.side[l - 1].stream, dev.fork, 0), "cudaStreamWaitEvent(fork)"));
      join.Forked(l + 1);
    }
  }
  for (size_t i = 0; i < count; ++i) {
    const int64_t r0 = strips[i], r1 = strips[i + 1];
    const size_t l = LaneOf(i, lanes);
    const Lane& lane = l == 0 ? dev.main : dev.side[l - 1];
    // Strip [r0, r1) × [r0, m): the whole product when there is a single strip.
    const GemmProblem g{op_left, op_right, r1 - r0, s.m - r0, s.k, s.ld, s.ld, s.ldd, s.batch, s.stride_p, s.stride_p,
                        s.stride_d};
    const GemmOperands o{s.alpha, rows_from(r0), rows_from(r0), s.beta, block_at(s.c, r0),
                         const_cast<char*>(block_at(s.d, r0))};
    RETURN_IF_ERROR(dev.lt->Run(dev.precision, g, o, lane.workspace, lane.stream));
  }
  RETURN_IF_ERROR(join.Join());
  return CudaCall(MirrorUpper(dev.precision.dtype, s.d, s.m, s.ldd, s.batch, s.stride_d, dev.main.stream),
                  "MirrorUpper");
}

}  // namespace orthoserve::cuda
