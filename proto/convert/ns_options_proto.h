// Conversions between the wire messages (orthoserve.v1) and the common/ types, shared by the
// server's RPC layer and the C++ client. Links protobuf, not gRPC.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "orthoserve/v1/orthogonalizer.pb.h"

namespace orthoserve {

// Wire options → NsOptions with every unset field at its default (proto/orthoserve/v1/orthogonalizer.proto). INVALID_ARGUMENT
// naming `what` and the field for an enum value this server does not know. Does not check
// ranges (ValidateNsOptions does).
absl::StatusOr<NsOptions> NsOptionsFromProto(const v1::NsOptions& proto, const std::string& what);

// NsOptions → wire options, every field set explicitly.
v1::NsOptions NsOptionsToProto(const NsOptions& options);

// Wire dtype → DType. INVALID_ARGUMENT naming `what` for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, const std::string& what);
v1::DType DTypeToProto(DType dtype);

// Wire N-d layout → NdLayout (UNSPECIFIED is flatten). INVALID_ARGUMENT naming `what` for an
// unknown value.
absl::StatusOr<NdLayout> NdLayoutFromProto(v1::NdLayout layout, const std::string& what);
v1::NdLayout NdLayoutToProto(NdLayout layout);

Block BlockFromProto(const v1::Block& proto);
v1::Block BlockToProto(const Block& block);

}  // namespace orthoserve
