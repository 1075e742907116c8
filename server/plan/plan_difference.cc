// FirstSpecDifference of server/plan/matrix_plan.h.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

std::string FirstSpecDifference(const MatrixPlan& a, const MatrixPlan& b) {
  if (a.name != b.name) return absl::StrCat("name (\"", BoundedText(a.name), "\" vs \"", BoundedText(b.name), "\")");
  if (a.shape != b.shape) {
    return absl::StrCat("shape ([", ListText(a.shape), "] vs [", ListText(b.shape), "])");
  }
  if (a.layout != b.layout) {
    return absl::StrCat("nd_layout (", NdLayoutName(a.layout), " vs ", NdLayoutName(b.layout), ")");
  }
  if (a.dtype != b.dtype) return absl::StrCat("dtype (", DTypeName(a.dtype), " vs ", DTypeName(b.dtype), ")");
  if (a.result_dtype != b.result_dtype) {
    return absl::StrCat("result_dtype (", DTypeName(a.result_dtype), " vs ", DTypeName(b.result_dtype), ")");
  }
  if (a.algorithm != b.algorithm) {
    return absl::StrCat("algorithm (", AlgorithmName(a.algorithm), " vs ", AlgorithmName(b.algorithm), ")");
  }
  if (a.partition_dim != b.partition_dim && IsTpSharded(a.algorithm)) {
    return absl::StrCat("partition_dim (", a.partition_dim, " vs ", b.partition_dim, ")");
  }
  const NsOptions& x = a.options;
  const NsOptions& y = b.options;
  if (x.coefficients != y.coefficients) {
    return absl::StrCat("options.coefficients (", CoefficientTypeName(x.coefficients), " vs ",
                        CoefficientTypeName(y.coefficients), ")");
  }
  if (x.custom_coefficients != y.custom_coefficients) return "options.custom_coefficients";
  if (x.steps != y.steps) return absl::StrCat("options.steps (", x.steps, " vs ", y.steps, ")");
  if (x.precision != y.precision) {
    return absl::StrCat("options.precision (", PrecisionName(x.precision), " vs ", PrecisionName(y.precision), ")");
  }
  if (x.eps != y.eps) return absl::StrCat("options.eps (", x.eps, " vs ", y.eps, ")");
  if (x.eps_mode != y.eps_mode) {
    return absl::StrCat("options.eps_mode (", EpsModeName(x.eps_mode), " vs ", EpsModeName(y.eps_mode), ")");
  }
  if (x.normalization != y.normalization) {
    return absl::StrCat("options.normalization (", NormalizationName(x.normalization), " vs ",
                        NormalizationName(y.normalization), ")");
  }
  if (x.transpose != y.transpose) {
    return absl::StrCat("options.transpose (", TransposeModeName(x.transpose), " vs ", TransposeModeName(y.transpose),
                        ")");
  }
  if (x.scale_mode != y.scale_mode) {
    return absl::StrCat("options.scale_mode (", ScaleModeName(x.scale_mode), " vs ", ScaleModeName(y.scale_mode), ")");
  }
  if (x.extra_scale != y.extra_scale) {
    return absl::StrCat("options.extra_scale (", x.extra_scale, " vs ", y.extra_scale, ")");
  }
  if (x.split_qkv != y.split_qkv) {
    return absl::StrCat("options.split_qkv ([", ListText(x.split_qkv), "] vs [",
                        ListText(y.split_qkv), "])");
  }
  return "";
}

}  // namespace orthoserve
