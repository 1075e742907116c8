// The checks of a MatrixPlan that do not depend on where its blocks are: run once where a plan
// enters a process — by the public ingress for a client's matrix (ParseMatrixSpec, which sets
// MatrixPlan::checked) and by ValidatePlan for a plan from another rank — and consumed as a
// verdict everywhere after (cost, owners, the engine).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

// INVALID_ARGUMENT, starting with `what` and naming the field: "algorithm", "dtype" and
// "result_dtype" (known values); "shape" (ViewAs2d) and "view" (must equal ViewAs2d(shape,
// layout)); "options" (ValidateNsOptions, and ValidateNsOptionsForShape of the view: split_qkv
// divisibility of the whole matrix); "nd_layout" (ValidateNdLayout); "partition_dim" (0 or 1 for
// TP_DUPLICATED and TP_DISTRIBUTED, ignored otherwise).
absl::Status CheckMatrix(const MatrixPlan& m, const std::string& what);

// The "nd_layout" check on its own: a known layout, and a batch of several matrices (BatchRows >
// 0) takes neither split_qkv nor TP_DISTRIBUTED or TP_BLOCKWISE (whose blocks are orthogonalized
// without the whole matrix). `what` starts the message.
absl::Status ValidateNdLayout(const MatrixPlan& m, const std::string& what);

}  // namespace orthoserve
