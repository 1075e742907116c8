// orthoctl's Newton–Schulz option flags (every option of the proto's NsOptions) plus --wire-dtype,
// --algorithm and --nd, and their translation into NsOptions.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/orthoctl/flags.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "orthoserve/v1/orthogonalizer.pb.h"

namespace orthoserve::orthoctl {

// The raw flag values; empty/unset means "not given" (the server default applies).
struct NsFlagValues {
  std::string coefficients;
  std::string custom_coefficients;
  std::string steps;
  std::string precision;
  std::string eps;
  std::string eps_mode;
  std::string normalization;
  std::string transpose;
  std::string scale_mode;
  std::string extra_scale;
  std::string split_qkv;
  std::string wire_dtype;
  std::string algorithm;
  std::string nd;
};

// Registers --coefficients, --custom-coefficients, --steps, --precision, --eps, --eps-mode,
// --normalization, --transpose, --scale-mode, --extra-scale, --split-qkv, --wire-dtype, --algorithm and --nd on `flags`,
// storing into `values` (which must outlive the parse).
void AddNsFlags(FlagSet* flags, NsFlagValues* values);

// The options the flags describe, defaults for the rest, checked with ValidateNsOptions.
// --custom-coefficients alone selects the custom set; with --coefficients other than custom it is
// an error. INVALID_ARGUMENT naming the flag for any bad value.
absl::StatusOr<NsOptions> NsOptionsFromFlags(const NsFlagValues& values);

// --wire-dtype, or nullopt when not given. INVALID_ARGUMENT for an unknown name.
absl::StatusOr<std::optional<DType>> WireDTypeFromFlags(const NsFlagValues& values);

// --algorithm (auto, row_sharded, gathered, tp_duplicated, tp_distributed, tp_blockwise), or
// ALGORITHM_UNSPECIFIED when not given. INVALID_ARGUMENT listing the names otherwise.
absl::StatusOr<v1::Algorithm> AlgorithmFromFlags(const NsFlagValues& values);

// --nd (flatten, batch): how an N-d input is read as matrices; flatten when not given.
// INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<NdLayout> NdLayoutFromFlags(const NsFlagValues& values);

}  // namespace orthoserve::orthoctl
