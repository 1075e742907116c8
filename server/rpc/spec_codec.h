// The public ingress of a matrix: parsing and validation of the public API's MatrixSpecs (from
// clients) into the plan vocabulary's ParsedSpec (server/plan/matrix_plan.h). This is where a
// client's matrix is validated, once: the plan it makes is `checked`, and what comes after (cost,
// owners, ValidatePlan, the engine) consumes that verdict. Ranks describe matrices to each other
// with the fleet's own MatrixPlan message instead (server/fleet/wire/plan_codec.h), whose plans
// ValidatePlan checks where they arrive.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/shape.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

// The bounds a spec from a client is checked against (the server's flags of the same names).
struct SpecLimits {
  int64_t max_elements = int64_t{1} << 28;  // --max-matrix-elements: prod(shape).
  int max_name_bytes = 1024;                // --max-name-bytes: bytes of MatrixSpec.name.
  int max_shape_dims = 16;                  // --max-shape-dims: entries of MatrixSpec.shape.
};

// Checks the size of spec `index`'s metadata against `limits`, reading only the sizes of its
// fields (nothing is copied or allocated but the message): INVALID_ARGUMENT naming the matrix
// (MatrixLabel, its name bounded), the field and the flag for a name over max_name_bytes, then a
// shape of more than max_shape_dims dims. A spec over a metadata limit is refused as a whole (the
// caller fails its step), unlike the other errors of ParseMatrixSpec, which a lone step answers
// in-band.
absl::Status CheckSpecLimits(const v1::MatrixSpec& spec, int index, const SpecLimits& limits);

// Validates and parses spec `index`. Checks, in order, with INVALID_ARGUMENT naming the matrix
// (MatrixLabel: "matrix 3 (\"w1\")", the name bounded) and the field: CheckSpecLimits, the counts
// of custom_coefficients (at most kMaxCustomCoefficients) and split_qkv (at most 3) before they
// are copied, shape (>= 2 dims, each > 0, no overflow), dtype, result_dtype, options (values
// known, ranges valid, split_qkv divisibility), algorithm, partition_dim for the TP modes, the
// block (inside the matrix). RESOURCE_EXHAUSTED when the matrix has more than
// limits.max_elements elements. An all-zero block means the whole matrix when `whole_if_unset`
// (lone clients), and an empty block otherwise. The parsed plan is `checked`, its cost computed.
absl::StatusOr<ParsedSpec> ParseMatrixSpec(const v1::MatrixSpec& spec, int index, const SpecLimits& limits,
                                           bool whole_if_unset);

}  // namespace orthoserve
