// An independent, deliberately plain reference of docs/numerics.md for the engine tests: naive triple
// loops, its own coefficient tables, scale factors and bf16 rounding, sharing no code with the
// backends. Highest: the loop in float64. Medium: the bf16-emulating loop of the contract.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/ns_options.h"

namespace orthoserve::testing {

struct RefTriple {
  double a, b, c;
};

// The docs/numerics.md table for `type` expanded to `steps` triples (custom: `custom` cycled).
std::vector<RefTriple> RefSchedule(CoefficientType type, int steps, const std::vector<RefTriple>& custom = {});

// scale(out = rows, in = cols) of docs/numerics.md, times extra.
double RefScale(int64_t rows, int64_t cols, ScaleMode mode, double extra);

struct RefArgs {
  std::vector<RefTriple> schedule;
  bool medium = false;  // false: float64 throughout; true: the bf16-emulating loop.
  double eps = 1e-7;
  bool eps_add = false;    // X / (‖X‖ + eps) instead of X / max(‖X‖, eps).
  // torch.optim.Muon's normalization (medium only): G rounded to bf16, ‖G‖ (of those values, to
  // fp32 then bf16) and eps rounded to bf16, each quotient fp32 then bf16.
  bool bf16_normalization = false;
  bool transpose = false;  // Work on Gᵀ.
  double scale = 1.0;
};

// The reference's arguments for `options` on a rows × cols matrix, from the reference's own
// tables and scales (shared by the engine tests and the binaries' integration test).
RefArgs RefArgsFor(const NsOptions& options, int64_t rows, int64_t cols);

// scale · NS(g) for a row-major rows × cols matrix `g` (the input values as the backend sees
// them, already widened from the input dtype). Medium: x = bf16(fp32(g) / fp32(divisor));
// A = bf16(X·Xᵀ); B = bf16(b·A + c·A·A); X = bf16(a·X + B·X) (c = 0: bf16(a·X + b·A·X)), the
// sums accumulated in double, each output rounded to fp32 and then bf16.
std::vector<double> ReferenceNs(const std::vector<double>& g, int64_t rows, int64_t cols, const RefArgs& args);

// Round to nearest even bf16, returned as a double (finite inputs).
double RefBf16(double value);

// ‖a − b‖_F / ‖b‖_F (‖a‖_F when b is zero).
double RelativeError(const std::vector<double>& a, const std::vector<double>& b);

// Gaussian rows × cols matrix with a fixed seed.
std::vector<double> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed);

// Row-major transpose of a rows × cols matrix.
std::vector<double> TransposeOf(const std::vector<double>& m, int64_t rows, int64_t cols);

}  // namespace orthoserve::testing
