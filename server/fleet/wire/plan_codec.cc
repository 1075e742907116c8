// Implementation of server/fleet/wire/plan_codec.h.
#include "server/fleet/wire/plan_codec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"
#include "proto/convert/ns_options_proto.h"
#include "proto/convert/algorithm_proto.h"

namespace orthoserve {
namespace {

// The decode proper; `what` starts every error message, followed by the field. (With an empty
// `what` the field names fit std::string's small buffer: nothing is allocated for them.)
absl::StatusOr<MatrixPlan> Decode(const fleet::v1::MatrixPlan& p, const std::string& what) {
  MatrixPlan plan;
  plan.name = p.name();
  plan.shape.assign(p.shape().begin(), p.shape().end());
  ASSIGN_OR_RETURN(plan.layout, NdLayoutFromProto(p.nd_layout(), what));
  ASSIGN_OR_RETURN(plan.view, ViewAs2d(plan.shape, absl::StrCat(what, " shape"), plan.layout));
  ASSIGN_OR_RETURN(plan.dtype, DTypeFromProto(p.dtype(), absl::StrCat(what, " dtype")));
  ASSIGN_OR_RETURN(plan.result_dtype, DTypeFromProto(p.result_dtype(), absl::StrCat(what, " result_dtype")));
  ASSIGN_OR_RETURN(plan.options, NsOptionsFromProto(p.options(), absl::StrCat(what, " options")));
  ASSIGN_OR_RETURN(plan.algorithm, AlgorithmFromProto(p.algorithm(), what));
  plan.partition_dim = p.partition_dim();
  return plan;
}

}  // namespace

fleet::v1::MatrixPlan MatrixPlanToProto(const MatrixPlan& plan) {
  fleet::v1::MatrixPlan p;
  p.set_name(plan.name);
  p.mutable_shape()->Reserve(static_cast<int>(plan.shape.size()));
  for (int64_t d : plan.shape) p.add_shape(d);
  p.set_nd_layout(NdLayoutToProto(plan.layout));
  p.set_dtype(DTypeToProto(plan.dtype));
  p.set_result_dtype(DTypeToProto(plan.result_dtype));
  *p.mutable_options() = NsOptionsToProto(plan.options);
  p.set_algorithm(AlgorithmToProto(plan.algorithm));
  p.set_partition_dim(plan.partition_dim);
  return p;
}

absl::StatusOr<MatrixPlan> MatrixPlanFromProto(const fleet::v1::MatrixPlan& proto, int index) {
  // Hundreds of thousands of plans per step at training scale: the message naming the matrix and
  // its fields is built only for a plan that fails (decoded again, which fails the same way).
  static const std::string kUnnamed;
  absl::StatusOr<MatrixPlan> plan = Decode(proto, kUnnamed);
  if (plan.ok()) return plan;
  absl::StatusOr<MatrixPlan> named = Decode(proto, MatrixLabel(index, proto.name()));
  return named.ok() ? plan.status() : named.status();
}

}  // namespace orthoserve
