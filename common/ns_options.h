// Newton–Schulz options (docs/numerics.md): coefficient sets and their step schedules, precision,
// eps and its mode, transpose, scale modes, split_qkv — and their validation.
//
// The defaults are Emerging-Optimizers' Muon defaults: quintic, 5 steps, MEDIUM precision,
// eps 1e-7 in max mode, transpose auto, spectral scale, extra scale 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shape.h"

namespace orthoserve {

enum class CoefficientType { kSimple, kQuintic, kPolarExpress, kAol, kCans, kDeepseekV4, kCubic5, kCustom };

// fp32 everywhere (HIGHEST); TF32 tensor cores allowed on GPU, = HIGHEST on CPU (HIGH); bf16
// operands with fp32 accumulation, every product output rounded once to bf16 (MEDIUM).
enum class Precision { kHighest, kHigh, kMedium };

// X / max(‖X‖_F, eps) (kMax, Emerging-Optimizers) or X / (‖X‖_F + eps) (kAdd, Keller Jordan).
enum class EpsMode { kMax, kAdd };

// Where the normalization rounds: ‖X‖ and X / ‖X‖ in fp32 (kFp32, Emerging-Optimizers), or
// torch.optim.Muon's order (kBf16): X rounded to bf16 first, ‖X‖ and eps rounded to bf16, each
// quotient rounded to bf16. kBf16 needs Precision::kMedium.
enum class Normalization { kFp32, kBf16 };
// kAuto works on Xᵀ when rows > cols; kOn and kOff force it.
enum class TransposeMode { kAuto, kOn, kOff };

// Scale factor for a matrix of out = rows, in = cols: √max(out, in) (kSpectral),
// √max(1, out/in) (kShapeScaling), √(out/in) (kUnitRmsNorm), 1 (kNone).
enum class ScaleMode { kSpectral, kShapeScaling, kUnitRmsNorm, kNone };

struct CoefficientTriple {
  double a = 0;
  double b = 0;
  double c = 0;
  bool operator==(const CoefficientTriple& o) const { return a == o.a && b == o.b && c == o.c; }
};

inline constexpr int kMaxSteps = 100;
inline constexpr size_t kMaxCustomCoefficients = 100;

struct NsOptions {
  CoefficientType coefficients = CoefficientType::kQuintic;  // Which coefficient set.
  std::vector<CoefficientTriple> custom_coefficients;        // Triples for kCustom (cycled).
  int steps = 5;                                             // 0..100; cubic5 needs exactly 5.
  Precision precision = Precision::kMedium;                  // Matmul precision.
  double eps = 1e-7;                                         // Norm floor (kMax) or addend (kAdd); >= 0.
  EpsMode eps_mode = EpsMode::kMax;                          // How eps enters the normalization.
  TransposeMode transpose = TransposeMode::kAuto;            // Work on the wide orientation.
  ScaleMode scale_mode = ScaleMode::kSpectral;               // Shape-dependent output scale.
  double extra_scale = 1.0;                                  // Multiplies the scale factor; finite.
  std::vector<int64_t> split_qkv;                            // Empty, or {q, k, v} rows per group.
  Normalization normalization = Normalization::kFp32;        // Where the normalization rounds.

  bool operator==(const NsOptions& o) const;
  bool operator!=(const NsOptions& o) const { return !(*this == o); }
};

// Names as used on the command line and in messages: "quintic", "highest", "max", "auto",
// "spectral", ... Parse* return INVALID_ARGUMENT listing the accepted names.
absl::string_view CoefficientTypeName(CoefficientType type);
absl::string_view PrecisionName(Precision precision);
absl::string_view EpsModeName(EpsMode mode);
absl::string_view NormalizationName(Normalization normalization);
absl::string_view TransposeModeName(TransposeMode mode);
absl::string_view ScaleModeName(ScaleMode mode);
absl::Status ParseCoefficientType(absl::string_view text, CoefficientType* type);
absl::Status ParsePrecision(absl::string_view text, Precision* precision);
absl::Status ParseEpsMode(absl::string_view text, EpsMode* mode);
absl::Status ParseNormalization(absl::string_view text, Normalization* normalization);
absl::Status ParseTransposeMode(absl::string_view text, TransposeMode* mode);
absl::Status ParseScaleMode(absl::string_view text, ScaleMode* mode);

// Parses "a,b,c;a,b,c" into triples. INVALID_ARGUMENT on a malformed or non-finite entry.
absl::StatusOr<std::vector<CoefficientTriple>> ParseCustomCoefficients(absl::string_view text);

// The fixed triples of a named set (docs/numerics.md). Empty for kCustom.
const std::vector<CoefficientTriple>& CoefficientTable(CoefficientType type);

// Checks the shape-independent options. INVALID_ARGUMENT names the field (prefixed by `what`,
// for example "matrix \"w1\" options") and says what to change. The server runs it once per
// matrix, where the matrix enters the process (server/plan/matrix_checks.h).
absl::Status ValidateNsOptions(const NsOptions& options, const std::string& what);

// How many times ValidateNsOptions has run in this process: tests count that a matrix is
// validated once on its way.
int64_t NsOptionsValidations();

// Checks the options that depend on the 2-D view of the matrix (split_qkv divisibility; a
// split_qkv that is not three positive sizes is refused too, so that the check is safe on
// options that were not validated).
absl::Status ValidateNsOptionsForShape(const NsOptions& options, Matrix2d matrix, const std::string& what);

// One triple per step: the set's list followed by its tail rule (cycle, or repeat the last).
// Requires ValidateNsOptions(options) to pass.
std::vector<CoefficientTriple> CoefficientSchedule(const NsOptions& options);

// scale(out = rows, in = cols) · extra_scale.
double ScaleFactor(int64_t rows, int64_t cols, ScaleMode mode, double extra_scale);

// Whether NS works on the transposed matrix for a rows × cols input.
bool ResolveTranspose(TransposeMode mode, int64_t rows, int64_t cols);

// Multiply-add count of NS on a rows × cols matrix with these options (2 per multiply-add),
// counting the products as computed (the c = 0 path skips A·A; symmetric products count whole).
double NsFlops(int64_t rows, int64_t cols, const NsOptions& options);

}  // namespace orthoserve
