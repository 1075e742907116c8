// Parsing and validation of the public API's MatrixSpecs (from clients, at ingress in server/rpc)
// into the distributed layer's MatrixPlan. Ranks describe matrices to each other with the fleet's
// own MatrixPlan message instead (server/fleet/plan_codec.h), which is not validated again.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/shape.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/distributed/batch.h"

namespace orthoserve {

// Validates and parses spec `index`. Checks, in order, with INVALID_ARGUMENT naming the matrix
// ("matrix 3 (\"w1\")") and the field: shape (≥ 2 dims, each > 0, no overflow), dtype,
// result_dtype, options (values known, ranges valid, split_qkv divisibility), algorithm,
// partition_dim for the TP modes, the block (inside the matrix). RESOURCE_EXHAUSTED when the
// matrix has more than `max_elements` elements. An all-zero block means the whole matrix when
// `whole_if_unset` (lone clients), and an empty block otherwise.
absl::StatusOr<ParsedSpec> ParseMatrixSpec(const v1::MatrixSpec& spec, int index, int64_t max_elements,
                                           bool whole_if_unset);

// The wire enum of an algorithm and back (shared with plan_codec); AlgorithmFromProto gives
// INVALID_ARGUMENT naming `what` for a value this server does not know (UNSPECIFIED is AUTO).
v1::Algorithm AlgorithmToProto(Algorithm algorithm);
absl::StatusOr<Algorithm> AlgorithmFromProto(v1::Algorithm algorithm, const std::string& what);

}  // namespace orthoserve
