// Implementation of server/engine/cpu/elementwise_ns.h.
#include "server/engine/cpu/elementwise_ns.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "server/engine/cpu/ns_loop.h"
#include "server/engine/cpu/working_matrix.h"

namespace orthoserve {
namespace {

// Below this many elements (4 MiB of fp32) one thread does both passes: handing parts to the
// pool costs more than it saves on matrices that stay in the caches.
constexpr int64_t kSplitFrom = int64_t{1} << 20;
// Parts per thread: a thread that is held up by something else leaves fewer elements behind.
constexpr int64_t kPartsPerThread = 4;

// Whether the store pass may run on disjoint slices at once: each slice then reads and writes
// only its own elements' bytes.
bool SlicesIndependent(const NsTask& task, int64_t count) {
  const auto in = reinterpret_cast<uintptr_t>(task.in);
  const auto out = reinterpret_cast<uintptr_t>(task.out);
  const auto in_bytes = static_cast<uintptr_t>(count) * ElementSize(task.in_dtype);
  const auto out_bytes = static_cast<uintptr_t>(count) * ElementSize(task.out_dtype);
  if (in + in_bytes <= out || out + out_bytes <= in) return true;
  return in == out && ElementSize(task.in_dtype) == ElementSize(task.out_dtype);
}

}  // namespace

absl::Status RunElementwiseNs(ParallelFor& pool, const NsTask& task) {
  const NsKernelArgs& args = *task.args;
  const int64_t count = task.shape.rows * task.shape.cols;
  const size_t in_elem = ElementSize(task.in_dtype);
  const size_t out_elem = ElementSize(task.out_dtype);
  const auto* in = static_cast<const char*>(task.in);
  auto* out = static_cast<char*>(task.out);

  const int64_t blocks = (count + kSquaresBlock - 1) / kSquaresBlock;
  const int64_t parts =
      pool.threads() == 1 || count < kSplitFrom ? 1 : std::min(blocks, pool.threads() * kPartsPerThread);
  // Part p covers blocks [first(p), first(p + 1)).
  auto first = [blocks, parts](int64_t p) { return p * blocks / parts; };
  auto element = [count](int64_t block) { return std::min(count, block * kSquaresBlock); };

  double sum_squares = 0;
  if (parts == 1) {
    sum_squares = SumOfSquaresOf(task.in_dtype, in, count);
  } else {
    std::vector<double> sums(static_cast<size_t>(blocks));
    pool.Run(parts, [&](int64_t p) {
      for (int64_t b = first(p); b < first(p + 1); ++b) {
        sums[b] = BlockSumOfSquares(task.in_dtype, in + element(b) * in_elem, element(b + 1) - element(b));
      }
    });
    for (double s : sums) sum_squares += s;  // SumOfSquaresOf's order: block by block from 0.
  }
  RETURN_IF_ERROR(CheckSumOfSquares(sum_squares));
  const float divisor = NormDivisor(sum_squares, args.eps, args.eps_mode);
  const bool round_bf16 = args.precision == Precision::kMedium;

  auto store = [&](int64_t begin, int64_t end) {
    NormalizeScaleStore(task.in_dtype, in + begin * in_elem, end - begin, divisor, round_bf16, args.scale,
                        task.out_dtype, out + begin * out_elem);
  };
  if (parts == 1 || !SlicesIndependent(task, count)) {
    store(0, count);
    return absl::OkStatus();
  }
  pool.Run(parts, [&](int64_t p) { store(element(first(p)), element(first(p + 1))); });
  return absl::OkStatus();
}

}  // namespace orthoserve
