// What `orthoctl orthogonalize` must write for an input .npy and options, computed in process:
// the same-backend engine answer (bit-exact: the server runs CpuBackend with 1 BLAS thread) and
// the independent reference of tests/unit/engine/reference_ns (within the precision's tolerance),
// both mirroring orthoctl's conversions (npy dtype -> wire dtype -> server -> wire dtype -> npy dtype).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/npy.h"
#include "common/dtype.h"
#include "common/ns_options.h"

namespace orthoserve::testing {

// Elements of an .npy array widened to double.
std::vector<double> ValuesOf(const client::NpyArray& array);

// An array of `dtype` and `shape` holding `values` (rounded to the dtype).
client::NpyArray MakeArray(DType dtype, const std::vector<int64_t>& shape, const std::vector<double>& values);

// A Gaussian array of `dtype` and `shape` with a fixed seed.
client::NpyArray RandomArray(DType dtype, const std::vector<int64_t>& shape, uint32_t seed);

// The engine's result (OrthogonalizeOne on a CpuBackend with 1 thread) for `in` sent as `wire`
// (default: the input's dtype), converted back to the input's dtype as orthoctl does.
absl::StatusOr<client::NpyArray> EngineExpected(const client::NpyArray& in, const NsOptions& options,
                                                std::optional<DType> wire = std::nullopt);

// The independent reference (float64 for HIGHEST/HIGH, bf16-emulating for MEDIUM) for `in` as
// the server sees it (npy dtype -> fp32 -> wire dtype), split_qkv applied, unrounded.
std::vector<double> ReferenceExpected(const client::NpyArray& in, const NsOptions& options,
                                      std::optional<DType> wire = std::nullopt);

// Relative Frobenius tolerance of the output against ReferenceExpected: 1e-5 (HIGHEST/HIGH) or
// 1e-2 (MEDIUM), plus the relative spacing of the narrowest dtype the result passes through
// (wire and npy dtype; rounding to it moves each element by at most half of that).
double ReferenceTolerance(const NsOptions& options, DType npy_dtype, std::optional<DType> wire = std::nullopt);

}  // namespace orthoserve::testing
