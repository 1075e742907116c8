// Implementation of client/cpp/orthoctl/ns_flags.h.
#include "client/cpp/orthoctl/ns_flags.h"

#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace orthoserve::orthoctl {
namespace {

absl::Status FlagError(absl::string_view flag, const absl::Status& status) { return Annotate(status, flag); }

absl::StatusOr<double> ParseFinite(absl::string_view flag, const std::string& text) {
  double v = 0;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " expects a finite number, got \"", text, "\""));
  }
  return v;
}

}  // namespace

void AddNsFlags(FlagSet* flags, NsFlagValues* v) {
  flags->AddString("coefficients", "NAME",
                   "coefficient set: simple, quintic, polar_express, aol, cans, deepseekv4, cubic5, custom "
                   "(default quintic)",
                   &v->coefficients);
  flags->AddString("custom-coefficients", "\"a,b,c;a,b,c\"",
                   "custom (a, b, c) triples, cycled; implies --coefficients custom", &v->custom_coefficients);
  flags->AddString("steps", "N", "Newton–Schulz steps, 0..100 (default 5; cubic5 needs 5)", &v->steps);
  flags->AddString("precision", "P", "matmul precision: highest, high, medium (default medium)", &v->precision);
  flags->AddString("eps", "X", "norm floor (max) or addend (add), >= 0 (default 1e-7)", &v->eps);
  flags->AddString("eps-mode", "M", "X/max(|X|,eps) (max) or X/(|X|+eps) (add) (default max)", &v->eps_mode);
  flags->AddString("normalization", "N",
                   "where the normalization rounds: fp32, or bf16 (torch.optim.Muon's order; needs --precision "
                   "medium) (default fp32)",
                   &v->normalization);
  flags->AddString("transpose", "T", "work on the wide orientation: auto, on, off (default auto)", &v->transpose);
  flags->AddString("scale-mode", "S", "output scale: spectral, shape_scaling, unit_rms_norm, none (default spectral)",
                   &v->scale_mode);
  flags->AddString("extra-scale", "X", "multiplies the scale factor (default 1)", &v->extra_scale);
  flags->AddString("split-qkv", "q,k,v", "fused QKV rows per query group; each part orthogonalized alone",
                   &v->split_qkv);
  flags->AddString("wire-dtype", "D",
                   "dtype the data travels in: fp32, bf16, fp16 (default: the input's); the result is converted "
                   "back to the input's dtype",
                   &v->wire_dtype);
  flags->AddString("algorithm", "A",
                   "auto, row_sharded, gathered, tp_duplicated, tp_distributed, tp_blockwise (default auto)",
                   &v->algorithm);
  flags->AddString("nd", "L",
                   "how an N-d input is read: flatten (one shape[0] x prod(rest) matrix, Muon's convention) or "
                   "batch (prod(shape[:-2]) matrices of shape[-2] x shape[-1], Emerging-Optimizers'); default flatten",
                   &v->nd);
}

absl::StatusOr<NsOptions> NsOptionsFromFlags(const NsFlagValues& v) {
  NsOptions o;
  if (!v.coefficients.empty()) {
    RETURN_IF_ERROR(FlagError("--coefficients", ParseCoefficientType(v.coefficients, &o.coefficients)));
  }
  if (!v.custom_coefficients.empty()) {
    if (!v.coefficients.empty() && o.coefficients != CoefficientType::kCustom) {
      return absl::InvalidArgumentError(
          absl::StrCat("--custom-coefficients needs --coefficients custom, not ", v.coefficients));
    }
    absl::StatusOr<std::vector<CoefficientTriple>> triples = ParseCustomCoefficients(v.custom_coefficients);
    if (!triples.ok()) return FlagError("--custom-coefficients", triples.status());
    o.coefficients = CoefficientType::kCustom;
    o.custom_coefficients = *std::move(triples);
  }
  if (!v.steps.empty() && !absl::SimpleAtoi(v.steps, &o.steps)) {
    return absl::InvalidArgumentError(absl::StrCat("--steps expects an integer, got \"", v.steps, "\""));
  }
  if (!v.precision.empty()) RETURN_IF_ERROR(FlagError("--precision", ParsePrecision(v.precision, &o.precision)));
  if (!v.eps.empty()) {
    ASSIGN_OR_RETURN(o.eps, ParseFinite("--eps", v.eps));
  }
  if (!v.eps_mode.empty()) RETURN_IF_ERROR(FlagError("--eps-mode", ParseEpsMode(v.eps_mode, &o.eps_mode)));
  if (!v.normalization.empty()) {
    RETURN_IF_ERROR(FlagError("--normalization", ParseNormalization(v.normalization, &o.normalization)));
  }
  if (!v.transpose.empty()) RETURN_IF_ERROR(FlagError("--transpose", ParseTransposeMode(v.transpose, &o.transpose)));
  if (!v.scale_mode.empty()) RETURN_IF_ERROR(FlagError("--scale-mode", ParseScaleMode(v.scale_mode, &o.scale_mode)));
  if (!v.extra_scale.empty()) {
    ASSIGN_OR_RETURN(o.extra_scale, ParseFinite("--extra-scale", v.extra_scale));
  }
  if (!v.split_qkv.empty()) {
    std::vector<std::string> parts = absl::StrSplit(v.split_qkv, ',');
    for (const std::string& part : parts) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(part, &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--split-qkv expects q,k,v integers, got \"", v.split_qkv, "\""));
      }
      o.split_qkv.push_back(n);
    }
  }
  RETURN_IF_ERROR(ValidateNsOptions(o, "options"));
  return o;
}

absl::StatusOr<std::optional<DType>> WireDTypeFromFlags(const NsFlagValues& v) {
  if (v.wire_dtype.empty()) return std::optional<DType>();
  DType dtype;
  RETURN_IF_ERROR(FlagError("--wire-dtype", ParseDType(v.wire_dtype, &dtype)));
  return std::optional<DType>(dtype);
}

absl::StatusOr<NdLayout> NdLayoutFromFlags(const NsFlagValues& v) {
  NdLayout layout = NdLayout::kFlatten;
  if (!v.nd.empty()) RETURN_IF_ERROR(FlagError("--nd", ParseNdLayout(v.nd, &layout)));
  return layout;
}

absl::StatusOr<v1::Algorithm> AlgorithmFromFlags(const NsFlagValues& v) {
  if (v.algorithm.empty()) return v1::ALGORITHM_UNSPECIFIED;
  v1::Algorithm algorithm;
  const std::string enum_name = absl::StrCat("ALGORITHM_", absl::AsciiStrToUpper(v.algorithm));
  if (enum_name == "ALGORITHM_UNSPECIFIED" || !v1::Algorithm_Parse(enum_name, &algorithm)) {
    return absl::InvalidArgumentError(absl::StrCat("--algorithm \"", v.algorithm,
                                                   "\" is not one of auto, row_sharded, gathered, tp_duplicated, "
                                                   "tp_distributed, tp_blockwise"));
  }
  return algorithm;
}

}  // namespace orthoserve::orthoctl
