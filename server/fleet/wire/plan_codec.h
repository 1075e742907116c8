// The fleet's own wire form of a matrix (orthoserve.fleet.v1.MatrixPlan): how ranks describe a
// matrix to each other in ready reports, log entries and peer compute requests.
#pragma once

#include "absl/status/statusor.h"
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

// `plan` without its placements and owner (those travel in PlannedMatrix), every field set
// explicitly: the options with every field (NsOptionsToProto), result_dtype and algorithm as
// they are, never unspecified. `plan.view` is not sent (the receiver computes it).
fleet::v1::MatrixPlan MatrixPlanToProto(const MatrixPlan& plan);

// Decodes plan `index` of a message from another rank of this version. Structural only: every
// enum value must be one this server knows (dtype and result_dtype also not unspecified), and the
// 2-D view is computed (ViewAs2d: at least 2 dims, each > 0, no overflow) — INVALID_ARGUMENT
// naming the matrix ("matrix 3 (\"w1\")") and the field otherwise, which means a corrupt or
// foreign message. Nothing else is checked: no element limit, no option ranges, no split_qkv
// divisibility, no layout or partition_dim rules. The matrix was validated where it entered the
// fleet (ParseMatrixSpec), and ValidatePlan, run identically on every rank before a batch (and
// by the coordinator's agreement check, FirstSpecDifference, across trainer ranks), fails a
// matrix that is wrong all the same on every rank. The result has no placements and owner -1.
absl::StatusOr<MatrixPlan> MatrixPlanFromProto(const fleet::v1::MatrixPlan& proto, int index);

}  // namespace orthoserve
