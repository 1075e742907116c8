// Implementation of server/rpc/spec_codec.h.
#include "server/rpc/spec_codec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/message_text.h"
#include "common/status.h"
#include "proto/convert/algorithm_proto.h"
#include "proto/convert/ns_options_proto.h"
#include "server/plan/matrix_checks.h"

namespace orthoserve {

absl::Status CheckSpecLimits(const v1::MatrixSpec& spec, int index, const SpecLimits& limits) {
  if (spec.name().size() > static_cast<size_t>(limits.max_name_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(index, spec.name()), " name has ", spec.name().size(),
                                                   " bytes; at most ", limits.max_name_bytes,
                                                   " are accepted (--max-name-bytes)"));
  }
  if (spec.shape_size() > limits.max_shape_dims) {
    return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(index, spec.name()), " shape has ", spec.shape_size(),
                                                   " dims; at most ", limits.max_shape_dims,
                                                   " are accepted (--max-shape-dims)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParsedSpec> ParseMatrixSpec(const v1::MatrixSpec& spec, int index, const SpecLimits& limits,
                                           bool whole_if_unset) {
  // Sizes first, before anything is copied from the spec.
  RETURN_IF_ERROR(CheckSpecLimits(spec, index, limits));
  const std::string what = MatrixLabel(index, spec.name());
  const std::string options_what = absl::StrCat(what, " options");
  // NsOptionsFromProto copies these lists before ValidateNsOptions bounds them (with the same
  // messages): their counts are checked here, before the copy.
  if (static_cast<size_t>(spec.options().custom_coefficients_size()) > kMaxCustomCoefficients) {
    return absl::InvalidArgumentError(absl::StrCat(options_what, ": custom_coefficients has ",
                                                   spec.options().custom_coefficients_size(), " triples; at most ",
                                                   kMaxCustomCoefficients, " are allowed"));
  }
  if (spec.options().split_qkv_size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(options_what, ": split_qkv has ", spec.options().split_qkv_size(),
                                                   " sizes; give exactly three (q, k, v rows per group)"));
  }
  ParsedSpec parsed;
  MatrixPlan& plan = parsed.plan;
  plan.name = spec.name();
  plan.shape.assign(spec.shape().begin(), spec.shape().end());
  ASSIGN_OR_RETURN(plan.layout, NdLayoutFromProto(spec.nd_layout(), what));
  ASSIGN_OR_RETURN(plan.view, ViewAs2d(plan.shape, absl::StrCat(what, " shape"), plan.layout));
  if (plan.view.numel() > limits.max_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " shape [", ListText(plan.shape), "] has ",
                                                     plan.view.numel(), " elements; this server accepts at most ",
                                                     limits.max_elements, " (--max-matrix-elements)"));
  }
  ASSIGN_OR_RETURN(plan.dtype, DTypeFromProto(spec.dtype(), absl::StrCat(what, " dtype")));
  if (spec.result_dtype() == v1::DTYPE_UNSPECIFIED) {
    plan.result_dtype = plan.dtype;
  } else {
    ASSIGN_OR_RETURN(plan.result_dtype, DTypeFromProto(spec.result_dtype(), absl::StrCat(what, " result_dtype")));
  }
  ASSIGN_OR_RETURN(plan.options, NsOptionsFromProto(spec.options(), options_what));
  RETURN_IF_ERROR(ValidateNsOptions(plan.options, options_what));
  RETURN_IF_ERROR(ValidateNsOptionsForShape(plan.options, plan.view, options_what));
  ASSIGN_OR_RETURN(plan.algorithm, AlgorithmFromProto(spec.algorithm(), what));
  plan.partition_dim = spec.partition_dim();
  if (IsTpSharded(plan.algorithm) && plan.partition_dim != 0 && plan.partition_dim != 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": partition_dim = ", plan.partition_dim, " must be 0 or 1 for ",
                                                   AlgorithmName(plan.algorithm)));
  }
  RETURN_IF_ERROR(ValidateNdLayout(plan, what));
  Block block = BlockFromProto(spec.block());
  const bool unset = block.row_offset == 0 && block.col_offset == 0 && block.rows == 0 && block.cols == 0;
  parsed.block = unset && whole_if_unset ? WholeBlock(plan.view) : block;
  RETURN_IF_ERROR(CheckBlockInside(parsed.block, plan.view, absl::StrCat(what, " block")));
  parsed.block_bytes = parsed.block.numel() * static_cast<int64_t>(ElementSize(plan.dtype));
  // Everything CheckMatrix checks has passed above: the plan carries the verdict, and its cost.
  plan.checked = true;
  parsed.cost = EstimatedCost(plan);
  return parsed;
}

}  // namespace orthoserve
