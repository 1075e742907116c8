// The one place where absl::Status and grpc::Status convert into each other. The canonical
// codes are numerically equal (checked below), so the code passes through unchanged and the
// message is kept. Header-only; include it only from code that links gRPC.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace orthoserve {

static_assert(static_cast<int>(absl::StatusCode::kCancelled) == static_cast<int>(grpc::StatusCode::CANCELLED));
static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) ==
              static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) ==
              static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
static_assert(static_cast<int>(absl::StatusCode::kAborted) == static_cast<int>(grpc::StatusCode::ABORTED));
static_assert(static_cast<int>(absl::StatusCode::kUnavailable) == static_cast<int>(grpc::StatusCode::UNAVAILABLE));
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// "OK", "INVALID_ARGUMENT", ... as used in metric labels.
inline std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace orthoserve
