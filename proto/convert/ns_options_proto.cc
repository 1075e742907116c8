// Implementation of proto/convert/ns_options_proto.h.
#include "proto/convert/ns_options_proto.h"

#include "absl/strings/str_cat.h"

namespace orthoserve {
namespace {

absl::Status UnknownEnum(const std::string& what, absl::string_view field, int value) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", field, " = ", value, " is not a value this server knows"));
}

}  // namespace

absl::StatusOr<NsOptions> NsOptionsFromProto(const v1::NsOptions& p, const std::string& what) {
  NsOptions o;
  switch (p.coefficients()) {
    case v1::COEFFICIENTS_UNSPECIFIED:
    case v1::COEFFICIENTS_QUINTIC: o.coefficients = CoefficientType::kQuintic; break;
    case v1::COEFFICIENTS_SIMPLE: o.coefficients = CoefficientType::kSimple; break;
    case v1::COEFFICIENTS_POLAR_EXPRESS: o.coefficients = CoefficientType::kPolarExpress; break;
    case v1::COEFFICIENTS_AOL: o.coefficients = CoefficientType::kAol; break;
    case v1::COEFFICIENTS_CANS: o.coefficients = CoefficientType::kCans; break;
    case v1::COEFFICIENTS_DEEPSEEKV4: o.coefficients = CoefficientType::kDeepseekV4; break;
    case v1::COEFFICIENTS_CUBIC5: o.coefficients = CoefficientType::kCubic5; break;
    case v1::COEFFICIENTS_CUSTOM: o.coefficients = CoefficientType::kCustom; break;
    default: return UnknownEnum(what, "coefficients", p.coefficients());
  }
  for (const v1::CoefficientTriple& t : p.custom_coefficients()) {
    o.custom_coefficients.push_back({t.a(), t.b(), t.c()});
  }
  if (p.has_steps()) o.steps = p.steps();
  switch (p.precision()) {
    case v1::PRECISION_UNSPECIFIED:
    case v1::PRECISION_MEDIUM: o.precision = Precision::kMedium; break;
    case v1::PRECISION_HIGHEST: o.precision = Precision::kHighest; break;
    case v1::PRECISION_HIGH: o.precision = Precision::kHigh; break;
    default: return UnknownEnum(what, "precision", p.precision());
  }
  if (p.has_eps()) o.eps = p.eps();
  switch (p.eps_mode()) {
    case v1::EPS_MODE_UNSPECIFIED:
    case v1::EPS_MODE_MAX: o.eps_mode = EpsMode::kMax; break;
    case v1::EPS_MODE_ADD: o.eps_mode = EpsMode::kAdd; break;
    default: return UnknownEnum(what, "eps_mode", p.eps_mode());
  }
  switch (p.transpose()) {
    case v1::TRANSPOSE_UNSPECIFIED:
    case v1::TRANSPOSE_AUTO: o.transpose = TransposeMode::kAuto; break;
    case v1::TRANSPOSE_ON: o.transpose = TransposeMode::kOn; break;
    case v1::TRANSPOSE_OFF: o.transpose = TransposeMode::kOff; break;
    default: return UnknownEnum(what, "transpose", p.transpose());
  }
  switch (p.scale_mode()) {
    case v1::SCALE_MODE_UNSPECIFIED:
    case v1::SCALE_MODE_SPECTRAL: o.scale_mode = ScaleMode::kSpectral; break;
    case v1::SCALE_MODE_SHAPE_SCALING: o.scale_mode = ScaleMode::kShapeScaling; break;
    case v1::SCALE_MODE_UNIT_RMS_NORM: o.scale_mode = ScaleMode::kUnitRmsNorm; break;
    case v1::SCALE_MODE_NONE: o.scale_mode = ScaleMode::kNone; break;
    default: return UnknownEnum(what, "scale_mode", p.scale_mode());
  }
  if (p.has_extra_scale()) o.extra_scale = p.extra_scale();
  o.split_qkv.assign(p.split_qkv().begin(), p.split_qkv().end());
  switch (p.normalization()) {
    case v1::NORMALIZATION_UNSPECIFIED:
    case v1::NORMALIZATION_FP32: o.normalization = Normalization::kFp32; break;
    case v1::NORMALIZATION_BF16: o.normalization = Normalization::kBf16; break;
    default: return UnknownEnum(what, "normalization", p.normalization());
  }
  return o;
}

v1::NsOptions NsOptionsToProto(const NsOptions& o) {
  v1::NsOptions p;
  switch (o.coefficients) {
    case CoefficientType::kSimple: p.set_coefficients(v1::COEFFICIENTS_SIMPLE); break;
    case CoefficientType::kQuintic: p.set_coefficients(v1::COEFFICIENTS_QUINTIC); break;
    case CoefficientType::kPolarExpress: p.set_coefficients(v1::COEFFICIENTS_POLAR_EXPRESS); break;
    case CoefficientType::kAol: p.set_coefficients(v1::COEFFICIENTS_AOL); break;
    case CoefficientType::kCans: p.set_coefficients(v1::COEFFICIENTS_CANS); break;
    case CoefficientType::kDeepseekV4: p.set_coefficients(v1::COEFFICIENTS_DEEPSEEKV4); break;
    case CoefficientType::kCubic5: p.set_coefficients(v1::COEFFICIENTS_CUBIC5); break;
    case CoefficientType::kCustom: p.set_coefficients(v1::COEFFICIENTS_CUSTOM); break;
  }
  for (const CoefficientTriple& t : o.custom_coefficients) {
    v1::CoefficientTriple* out = p.add_custom_coefficients();
    out->set_a(t.a);
    out->set_b(t.b);
    out->set_c(t.c);
  }
  p.set_steps(o.steps);
  switch (o.precision) {
    case Precision::kHighest: p.set_precision(v1::PRECISION_HIGHEST); break;
    case Precision::kHigh: p.set_precision(v1::PRECISION_HIGH); break;
    case Precision::kMedium: p.set_precision(v1::PRECISION_MEDIUM); break;
  }
  p.set_eps(o.eps);
  p.set_eps_mode(o.eps_mode == EpsMode::kAdd ? v1::EPS_MODE_ADD : v1::EPS_MODE_MAX);
  switch (o.transpose) {
    case TransposeMode::kAuto: p.set_transpose(v1::TRANSPOSE_AUTO); break;
    case TransposeMode::kOn: p.set_transpose(v1::TRANSPOSE_ON); break;
    case TransposeMode::kOff: p.set_transpose(v1::TRANSPOSE_OFF); break;
  }
  switch (o.scale_mode) {
    case ScaleMode::kSpectral: p.set_scale_mode(v1::SCALE_MODE_SPECTRAL); break;
    case ScaleMode::kShapeScaling: p.set_scale_mode(v1::SCALE_MODE_SHAPE_SCALING); break;
    case ScaleMode::kUnitRmsNorm: p.set_scale_mode(v1::SCALE_MODE_UNIT_RMS_NORM); break;
    case ScaleMode::kNone: p.set_scale_mode(v1::SCALE_MODE_NONE); break;
  }
  p.set_extra_scale(o.extra_scale);
  for (int64_t s : o.split_qkv) p.add_split_qkv(s);
  // fp32 stays the zero value, so that requests and plans without the option encode as before.
  if (o.normalization == Normalization::kBf16) p.set_normalization(v1::NORMALIZATION_BF16);
  return p;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, const std::string& what) {
  switch (dtype) {
    case v1::DTYPE_FP32: return DType::kF32;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_FP16: return DType::kF16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(absl::StrCat(what, " is unspecified; set DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, " = ", static_cast<int>(dtype),
                                                     " is not a known dtype (fp32, bf16, fp16)"));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_FP32;
    case DType::kBF16: return v1::DTYPE_BF16;
    case DType::kF16: return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<NdLayout> NdLayoutFromProto(v1::NdLayout layout, const std::string& what) {
  switch (layout) {
    case v1::ND_LAYOUT_UNSPECIFIED:
    case v1::ND_LAYOUT_FLATTEN: return NdLayout::kFlatten;
    case v1::ND_LAYOUT_BATCH: return NdLayout::kBatch;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": nd_layout = ", static_cast<int>(layout), " is not a value this server knows"));
  }
}

v1::NdLayout NdLayoutToProto(NdLayout layout) {
  return layout == NdLayout::kBatch ? v1::ND_LAYOUT_BATCH : v1::ND_LAYOUT_FLATTEN;
}

Block BlockFromProto(const v1::Block& p) { return Block{p.row_offset(), p.col_offset(), p.rows(), p.cols()}; }

v1::Block BlockToProto(const Block& b) {
  v1::Block p;
  p.set_row_offset(b.row_offset);
  p.set_col_offset(b.col_offset);
  p.set_rows(b.rows);
  p.set_cols(b.cols);
  return p;
}

}  // namespace orthoserve
