// Ingress of shared-memory slices (docs/shared_memory.md): the one place where a MatrixSpec's
// input_region and result_region are checked against the parsed spec and the caller's regions,
// and leased for the step (MatrixMemory, server/step/step.h). Used by unary calls and streams.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "server/metrics/metrics.h"
#include "server/plan/matrix_plan.h"
#include "server/shm/region_registry.h"
#include "server/step/step.h"

namespace orthoserve {

// The spec names a region for its input or its result.
inline bool NamesRegion(const v1::MatrixSpec& spec) { return spec.has_input_region() || spec.has_result_region(); }

// Bytes of matrix `parsed`'s result (its block in the result dtype).
int64_t ResultBytes(const ParsedSpec& parsed);

// Leases the slices `spec` names (matrix `index`, parsed as `parsed`) from `tenant`'s regions in
// `registry`, for the call `call_id` of the tenant (its client's id, held until the leases go,
// so that FenceCall can wait for them; empty: a call that cannot be fenced); a slice of a CUDA
// IPC region is device memory (MatrixMemory::*_space kDevice). Errors, each naming the matrix
// and the field: FAILED_PRECONDITION when `registry` is null (regions off) or the call was
// fenced; INVALID_ARGUMENT when a slice's size is not the block's (input) or the result's byte
// count, or when the two slices overlap; NOT_FOUND when the tenant has no such region;
// OUT_OF_RANGE when a slice is not inside its region. Counts the matrix in `metrics` (may be
// null) when it succeeds.
absl::StatusOr<MatrixMemory> LeaseRegions(const RegionRegistry* registry, absl::string_view tenant,
                                          absl::string_view call_id, int index, const v1::MatrixSpec& spec,
                                          const ParsedSpec& parsed, Metrics* metrics);

}  // namespace orthoserve
