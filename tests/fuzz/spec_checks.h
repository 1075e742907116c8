// What every fuzz target that reaches the public ingress of a matrix checks of its verdict
// (server/rpc/spec_codec.h): a spec ParseMatrixSpec accepts meets every bound its contract names,
// passes CheckMatrix (the check a plan from another rank gets), and travels between ranks
// (server/fleet/wire/plan_codec.h) unchanged; a refused one has a documented code and a bounded
// message.
#pragma once

#include <cmath>
#include <string>

#include "common/shape.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/fleet/wire/plan_codec.h"
#include "server/plan/matrix_checks.h"
#include "server/rpc/spec_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace orthoserve::fuzz {

inline void CheckSpecVerdict(const v1::MatrixSpec& spec, const SpecLimits& limits, bool whole_if_unset) {
  const absl::Status limits_status = CheckSpecLimits(spec, 3, limits);
  FUZZ_CHECK_ERROR(limits_status, absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<ParsedSpec> parsed = ParseMatrixSpec(spec, 3, limits, whole_if_unset);
  FUZZ_CHECK_ERROR(parsed.status(), absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted);
  if (!limits_status.ok()) {
    FUZZ_CHECK(parsed.status() == limits_status) << parsed.status() << " vs " << limits_status;
    return;
  }
  if (!parsed.ok()) return;
  const ParsedSpec& p = *parsed;
  const MatrixPlan& plan = p.plan;
  FUZZ_CHECK(plan.checked);
  FUZZ_CHECK(plan.name == spec.name());
  FUZZ_CHECK(static_cast<int>(plan.shape.size()) <= limits.max_shape_dims) << plan.shape.size();
  FUZZ_CHECK(plan.name.size() <= static_cast<size_t>(limits.max_name_bytes));
  const absl::StatusOr<Matrix2d> view = ViewAs2d(plan.shape, "shape", plan.layout);
  FUZZ_CHECK(view.ok() && *view == plan.view) << view.status();
  FUZZ_CHECK(plan.view.numel() > 0 && plan.view.numel() <= limits.max_elements) << plan.view.numel();
  const absl::Status inside = CheckBlockInside(p.block, plan.view, "block");
  FUZZ_CHECK(inside.ok()) << inside;
  const bool unset = spec.block().row_offset() == 0 && spec.block().col_offset() == 0 && spec.block().rows() == 0 &&
                     spec.block().cols() == 0;
  if (unset && whole_if_unset) FUZZ_CHECK(p.block == WholeBlock(plan.view)) << BlockString(p.block);
  FUZZ_CHECK(p.block_bytes == p.block.numel() * static_cast<int64_t>(ElementSize(plan.dtype))) << p.block_bytes;
  // The independent check agrees with the ingress's verdict.
  const absl::Status checked = CheckMatrix(plan, "matrix");
  FUZZ_CHECK(checked.ok()) << "accepted at ingress but CheckMatrix says " << checked;
  FUZZ_CHECK(std::isfinite(p.cost) && p.cost >= 0) << p.cost;
  FUZZ_CHECK(p.cost == EstimatedCost(plan)) << p.cost << " vs " << EstimatedCost(plan);
  // Sent to another rank: decoded unchanged, and judged the same there (unchecked).
  const absl::StatusOr<MatrixPlan> decoded = MatrixPlanFromProto(MatrixPlanToProto(plan), 3);
  FUZZ_CHECK(decoded.ok()) << decoded.status();
  FUZZ_CHECK(!decoded->checked);
  const std::string difference = FirstSpecDifference(plan, *decoded);
  FUZZ_CHECK(difference.empty()) << difference;
  FUZZ_CHECK(decoded->view == plan.view);
  const absl::Status decoded_checked = CheckMatrix(*decoded, "matrix");
  FUZZ_CHECK(decoded_checked.ok()) << decoded_checked;
  FUZZ_CHECK(EstimatedCost(*decoded) == p.cost) << EstimatedCost(*decoded) << " vs " << p.cost;
}

}  // namespace orthoserve::fuzz
