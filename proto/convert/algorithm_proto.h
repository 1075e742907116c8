// The wire enum of an algorithm (orthoserve.v1.Algorithm, also in the fleet's MatrixPlan) and
// back: the public ingress (server/rpc/spec_codec.h) and the fleet's plan codec share it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

v1::Algorithm AlgorithmToProto(Algorithm algorithm);
// INVALID_ARGUMENT naming `what` for a value this server does not know (UNSPECIFIED is AUTO).
absl::StatusOr<Algorithm> AlgorithmFromProto(v1::Algorithm algorithm, const std::string& what);

}  // namespace orthoserve
