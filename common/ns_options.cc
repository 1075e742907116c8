// Implementation of common/ns_options.h. The coefficient literals are docs/numerics.md's, verbatim.
#include "common/ns_options.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace orthoserve {
namespace {

const std::vector<CoefficientTriple> kSimple = {{3.4445, -4.7750, 2.0315}};
const std::vector<CoefficientTriple> kQuintic = {
    {4.0848, -6.8946, 2.9270}, {3.9505, -6.3029, 2.6377}, {3.7418, -5.5913, 2.3037},
    {2.8769, -3.1427, 1.2046}, {2.8366, -3.0525, 1.2012}};
const std::vector<CoefficientTriple> kPolarExpress = {
    {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250},
    {3.2856, -2.4153, 0.4853},   {2.2779, -1.6198, 0.3985}, {1.8726, -1.2307, 0.3585},
    {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750}};
const std::vector<CoefficientTriple> kAol = {
    {4.0098, -7.0585, 2.4635}, {3.4585, -5.5479, 2.5959}, {2.7573, -3.2939, 1.4254}, {2.7215, -3.0494, 1.3169}};
const std::vector<CoefficientTriple> kCans = {
    {8.4703, -25.1081, 18.6293}, {4.1828, -3.1087, 0.5806}, {3.9619, -2.9541, 0.5630},
    {3.2866, -2.4647, 0.5074},   {2.2737, -1.6447, 0.4162}};
const std::vector<CoefficientTriple> kDeepseekV4 = {
    {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315},
    {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315},
    {2.0, -1.5, 0.5},          {2.0, -1.5, 0.5}};
const std::vector<CoefficientTriple> kCubic5 = {{3.3656576, -3.3420992, 0},
                                                {2.5744352, -1.4957376, 0},
                                                {2.5368962, -1.4312570, 0},
                                                {2.4418906, -1.2764040, 0},
                                                {2.2230472, -0.9630650, 0}};
const std::vector<CoefficientTriple> kNone = {};

// Whether the schedule repeats its last triple (true) or cycles (false) past the list's end.
bool RepeatsLast(CoefficientType type) {
  return type == CoefficientType::kPolarExpress || type == CoefficientType::kCans ||
         type == CoefficientType::kDeepseekV4;
}

template <typename Enum>
struct NameEntry {
  Enum value;
  absl::string_view name;
};

template <typename Enum, size_t N>
absl::string_view LookupName(const NameEntry<Enum> (&table)[N], Enum value) {
  for (const auto& e : table) {
    if (e.value == value) return e.name;
  }
  return "unknown";
}

template <typename Enum, size_t N>
absl::Status LookupValue(const NameEntry<Enum> (&table)[N], absl::string_view text, absl::string_view field,
                         Enum* out) {
  std::vector<absl::string_view> names;
  for (const auto& e : table) {
    if (e.name == text) {
      *out = e.value;
      return absl::OkStatus();
    }
    names.push_back(e.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " \"", text, "\" is not one of ", absl::StrJoin(names, ", ")));
}

constexpr NameEntry<CoefficientType> kCoefficientNames[] = {
    {CoefficientType::kSimple, "simple"},   {CoefficientType::kQuintic, "quintic"},
    {CoefficientType::kPolarExpress, "polar_express"}, {CoefficientType::kAol, "aol"},
    {CoefficientType::kCans, "cans"},       {CoefficientType::kDeepseekV4, "deepseekv4"},
    {CoefficientType::kCubic5, "cubic5"},   {CoefficientType::kCustom, "custom"}};
constexpr NameEntry<Precision> kPrecisionNames[] = {
    {Precision::kHighest, "highest"}, {Precision::kHigh, "high"}, {Precision::kMedium, "medium"}};
constexpr NameEntry<EpsMode> kEpsModeNames[] = {{EpsMode::kMax, "max"}, {EpsMode::kAdd, "add"}};
constexpr NameEntry<Normalization> kNormalizationNames[] = {{Normalization::kFp32, "fp32"},
                                                            {Normalization::kBf16, "bf16"}};
constexpr NameEntry<TransposeMode> kTransposeNames[] = {
    {TransposeMode::kAuto, "auto"}, {TransposeMode::kOn, "on"}, {TransposeMode::kOff, "off"}};
constexpr NameEntry<ScaleMode> kScaleModeNames[] = {{ScaleMode::kSpectral, "spectral"},
                                                    {ScaleMode::kShapeScaling, "shape_scaling"},
                                                    {ScaleMode::kUnitRmsNorm, "unit_rms_norm"},
                                                    {ScaleMode::kNone, "none"}};

}  // namespace

bool NsOptions::operator==(const NsOptions& o) const {
  return coefficients == o.coefficients && custom_coefficients == o.custom_coefficients && steps == o.steps &&
         precision == o.precision && eps == o.eps && eps_mode == o.eps_mode && transpose == o.transpose &&
         scale_mode == o.scale_mode && extra_scale == o.extra_scale && split_qkv == o.split_qkv &&
         normalization == o.normalization;
}

absl::string_view CoefficientTypeName(CoefficientType t) { return LookupName(kCoefficientNames, t); }
absl::string_view PrecisionName(Precision p) { return LookupName(kPrecisionNames, p); }
absl::string_view EpsModeName(EpsMode m) { return LookupName(kEpsModeNames, m); }
absl::string_view NormalizationName(Normalization n) { return LookupName(kNormalizationNames, n); }
absl::string_view TransposeModeName(TransposeMode m) { return LookupName(kTransposeNames, m); }
absl::string_view ScaleModeName(ScaleMode m) { return LookupName(kScaleModeNames, m); }

absl::Status ParseCoefficientType(absl::string_view text, CoefficientType* t) {
  return LookupValue(kCoefficientNames, text, "coefficients", t);
}
absl::Status ParsePrecision(absl::string_view text, Precision* p) {
  return LookupValue(kPrecisionNames, text, "precision", p);
}
absl::Status ParseEpsMode(absl::string_view text, EpsMode* m) { return LookupValue(kEpsModeNames, text, "eps mode", m); }
absl::Status ParseNormalization(absl::string_view text, Normalization* n) {
  return LookupValue(kNormalizationNames, text, "normalization", n);
}
absl::Status ParseTransposeMode(absl::string_view text, TransposeMode* m) {
  return LookupValue(kTransposeNames, text, "transpose", m);
}
absl::Status ParseScaleMode(absl::string_view text, ScaleMode* m) {
  return LookupValue(kScaleModeNames, text, "scale mode", m);
}

absl::StatusOr<std::vector<CoefficientTriple>> ParseCustomCoefficients(absl::string_view text) {
  std::vector<CoefficientTriple> triples;
  for (absl::string_view entry : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ',');
    double v[3];
    bool ok = parts.size() == 3;
    for (size_t i = 0; ok && i < 3; ++i) {
      ok = absl::SimpleAtod(absl::StripAsciiWhitespace(parts[i]), &v[i]) && std::isfinite(v[i]);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("custom coefficients entry \"", entry,
                                                     "\" is not three finite numbers \"a,b,c\" "
                                                     "(triples are separated by ';')"));
    }
    triples.push_back({v[0], v[1], v[2]});
  }
  if (triples.empty()) {
    return absl::InvalidArgumentError("custom coefficients are empty; give at least one triple \"a,b,c\"");
  }
  return triples;
}

const std::vector<CoefficientTriple>& CoefficientTable(CoefficientType type) {
  switch (type) {
    case CoefficientType::kSimple: return kSimple;
    case CoefficientType::kQuintic: return kQuintic;
    case CoefficientType::kPolarExpress: return kPolarExpress;
    case CoefficientType::kAol: return kAol;
    case CoefficientType::kCans: return kCans;
    case CoefficientType::kDeepseekV4: return kDeepseekV4;
    case CoefficientType::kCubic5: return kCubic5;
    case CoefficientType::kCustom: return kNone;
  }
  return kNone;
}

namespace {
std::atomic<int64_t> validations{0};
}  // namespace

int64_t NsOptionsValidations() { return validations.load(std::memory_order_relaxed); }

absl::Status ValidateNsOptions(const NsOptions& o, const std::string& what) {
  validations.fetch_add(1, std::memory_order_relaxed);
  if (o.steps < 0 || o.steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": steps = ", o.steps, " is out of range; use 0 to ", kMaxSteps));
  }
  if (o.coefficients == CoefficientType::kCubic5 && o.steps != 5) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": coefficients cubic5 needs steps = 5 exactly, got ", o.steps));
  }
  if (o.coefficients == CoefficientType::kCustom) {
    if (o.custom_coefficients.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": coefficients custom needs a non-empty custom_coefficients list"));
    }
    if (o.custom_coefficients.size() > kMaxCustomCoefficients) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": custom_coefficients has ", o.custom_coefficients.size(),
                                                     " triples; at most ", kMaxCustomCoefficients, " are allowed"));
    }
    for (size_t i = 0; i < o.custom_coefficients.size(); ++i) {
      const CoefficientTriple& t = o.custom_coefficients[i];
      if (!std::isfinite(t.a) || !std::isfinite(t.b) || !std::isfinite(t.c)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": custom_coefficients[", i, "] is not finite; give finite a, b, c"));
      }
    }
  } else if (!o.custom_coefficients.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": custom_coefficients are given but coefficients is ",
                                                   CoefficientTypeName(o.coefficients),
                                                   "; set coefficients to custom or drop the list"));
  }
  if (!std::isfinite(o.eps) || o.eps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": eps = ", o.eps, " must be finite and >= 0"));
  }
  if (o.normalization == Normalization::kBf16 && o.precision != Precision::kMedium) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": normalization bf16 (torch.optim.Muon's order) needs ",
                                                   "precision medium, got ", PrecisionName(o.precision)));
  }
  if (!std::isfinite(o.extra_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": extra_scale = ", o.extra_scale, " must be finite"));
  }
  if (!o.split_qkv.empty()) {
    if (o.split_qkv.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": split_qkv has ", o.split_qkv.size(),
                                                     " sizes; give exactly three (q, k, v rows per group)"));
    }
    for (int64_t s : o.split_qkv) {
      if (s <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": split_qkv [", absl::StrJoin(o.split_qkv, ", "), "] must be positive sizes"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateNsOptionsForShape(const NsOptions& o, Matrix2d m, const std::string& what) {
  if (o.split_qkv.empty()) return absl::OkStatus();
  // A guard, not the options' validation: what ValidateNsOptions refuses cannot divide anything.
  if (o.split_qkv.size() != 3 || o.split_qkv[0] <= 0 || o.split_qkv[1] <= 0 || o.split_qkv[2] <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": split_qkv [", absl::StrJoin(o.split_qkv, ", "),
                                                   "] must be three positive sizes"));
  }
  const int64_t group = o.split_qkv[0] + o.split_qkv[1] + o.split_qkv[2];
  if (m.rows % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": split_qkv [", absl::StrJoin(o.split_qkv, ", "),
                                                   "] needs rows divisible by q+k+v = ", group, ", but rows = ",
                                                   m.rows));
  }
  return absl::OkStatus();
}

std::vector<CoefficientTriple> CoefficientSchedule(const NsOptions& o) {
  const std::vector<CoefficientTriple>& list =
      o.coefficients == CoefficientType::kCustom ? o.custom_coefficients : CoefficientTable(o.coefficients);
  std::vector<CoefficientTriple> schedule;
  schedule.reserve(o.steps);
  for (int i = 0; i < o.steps; ++i) {
    size_t n = list.size();
    size_t index = static_cast<size_t>(i) < n ? i : (RepeatsLast(o.coefficients) ? n - 1 : i % n);
    schedule.push_back(list[index]);
  }
  return schedule;
}

double ScaleFactor(int64_t rows, int64_t cols, ScaleMode mode, double extra_scale) {
  const double out = static_cast<double>(rows);
  const double in = static_cast<double>(cols);
  double scale = 1.0;
  switch (mode) {
    case ScaleMode::kSpectral: scale = std::sqrt(std::max(out, in)); break;
    case ScaleMode::kShapeScaling: scale = std::sqrt(std::max(1.0, out / in)); break;
    case ScaleMode::kUnitRmsNorm: scale = std::sqrt(out / in); break;
    case ScaleMode::kNone: scale = 1.0; break;
  }
  return scale * extra_scale;
}

bool ResolveTranspose(TransposeMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case TransposeMode::kAuto: return rows > cols;
    case TransposeMode::kOn: return true;
    case TransposeMode::kOff: return false;
  }
  return false;
}

double NsFlops(int64_t rows, int64_t cols, const NsOptions& o) {
  const bool t = ResolveTranspose(o.transpose, rows, cols);
  const double m = static_cast<double>(t ? cols : rows);  // Gram side.
  const double n = static_cast<double>(t ? rows : cols);  // Long side.
  double flops = 0;
  for (const CoefficientTriple& c : CoefficientSchedule(o)) {
    flops += 2 * m * m * n;                 // A = X·Xᵀ
    if (c.c != 0) flops += 2 * m * m * m;   // A·A
    flops += 2 * m * m * n;                 // B·X
  }
  return flops;
}

}  // namespace orthoserve
