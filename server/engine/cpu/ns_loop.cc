// Implementation of server/engine/cpu/ns_loop.h.
#include "server/engine/cpu/ns_loop.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "server/engine/cpu/bf16_round.h"
#include "server/engine/cpu/blas_products.h"
#include "server/engine/cpu/working_matrix.h"

namespace orthoserve {
namespace {

// A = Σ_s X_s·X_sᵀ (full storage), each term rounded to bf16 in MEDIUM, then summed over the
// participants and, in MEDIUM, the sum rounded to bf16 again. `scratch` holds gram² floats
// when there is more than one local shard.
absl::Status Gram(ParallelFor& pool, int64_t gram, std::vector<WorkingShard>& shards, bool medium, SumReducer* reducer,
                  std::vector<float>& a, std::vector<float>& scratch) {
  if (shards.empty()) std::fill(a.begin(), a.end(), 0.0f);
  for (size_t s = 0; s < shards.size(); ++s) {
    float* target = s == 0 ? a.data() : scratch.data();
    SyrkLower(pool, gram, shards[s].n, 1.0f, shards[s].x.data(), target, medium);
    if (s == 0) continue;
    for (int64_t i = 0; i < gram; ++i) {
      for (int64_t j = 0; j <= i; ++j) a[i * gram + j] += scratch[i * gram + j];
    }
  }
  if (!shards.empty()) MirrorLower(gram, a.data());
  if (reducer != nullptr) {
    RETURN_IF_ERROR(reducer->AllReduceSum(absl::MakeSpan(a)));
    if (medium) RoundToBf16InPlace(a.data(), static_cast<int64_t>(a.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSumOfSquares(double sum_squares) {
  if (std::isfinite(sum_squares)) return absl::OkStatus();
  return absl::InvalidArgumentError("the input holds a non-finite value (NaN or Inf)");
}

absl::Status RunNsLoop(ParallelFor& pool, const NsKernelArgs& args, int64_t gram, std::vector<WorkingShard>& shards,
                       SumReducer* reducer) {
  const bool medium = args.precision == Precision::kMedium;
  const bool bf16_norm = args.normalization == Normalization::kBf16;

  // kBf16: the input rounded to bf16 first, and its norm taken from the rounded values.
  if (bf16_norm) {
    for (WorkingShard& s : shards) RoundToBf16InPlace(s.x.data(), gram * s.n);
  }
  double sum_squares = 0;
  for (const WorkingShard& s : shards) sum_squares += SumOfSquares(s.x.data(), gram * s.n);
  if (reducer != nullptr) RETURN_IF_ERROR(reducer->AllReduceSum(absl::MakeSpan(&sum_squares, 1)));
  RETURN_IF_ERROR(CheckSumOfSquares(sum_squares));
  const float divisor = bf16_norm ? Bf16NormDivisor(sum_squares, args.eps, args.eps_mode)
                                  : NormDivisor(sum_squares, args.eps, args.eps_mode);
  for (WorkingShard& s : shards) NormalizeInPlace(s.x.data(), gram * s.n, divisor, medium);
  if (args.schedule.empty()) return absl::OkStatus();

  const size_t gram_count = static_cast<size_t>(gram * gram);
  std::vector<float> a, b, scratch;
  try {
    a.assign(gram_count, 0.0f);
    b.assign(gram_count, 0.0f);
    if (shards.size() > 1) scratch.assign(gram_count, 0.0f);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the ", gram, "x", gram, " Gram buffers"));
  }

  for (const CoefficientTriple& t : args.schedule) {
    const float ca = static_cast<float>(t.a);
    const float cb = static_cast<float>(t.b);
    const float cc = static_cast<float>(t.c);
    RETURN_IF_ERROR(Gram(pool, gram, shards, medium, reducer, a, scratch));
    if (t.c != 0.0) {
      // B = b·A + c·A·A, then X = a·X + B·X.
      SymmetricPolyLower(pool, gram, cc, cb, a.data(), b.data(), medium);
      MirrorLower(gram, b.data());
      for (WorkingShard& s : shards) {
        GemmAddmm(pool, gram, s.n, 1.0f, b.data(), s.x.data(), ca, s.y.data(), medium);
        std::swap(s.x, s.y);
      }
    } else {
      // c = 0: X = a·X + b·(A·X), no A·A.
      for (WorkingShard& s : shards) {
        GemmAddmm(pool, gram, s.n, cb, a.data(), s.x.data(), ca, s.y.data(), medium);
        std::swap(s.x, s.y);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
