// The one place where grpc::Status and absl::Status meet, for the server and the client. The
// canonical codes are numerically equal (google.rpc.Code), which grpc_status.cc checks at
// compile time.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace orthoserve {

// Same code and message; OK maps to OK.
absl::Status FromGrpcStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

// A google.rpc.Code number from the wire (MatrixResult.code) as an absl::Status; numbers outside
// 0..16 become UNKNOWN with the number kept in the message.
absl::Status StatusFromCode(int code, const std::string& message);

// Trailing metadata that marks a failure as caused by a change of the fleet's membership, so
// that a client may retry the whole step even when the code alone (ABORTED) would be final
// (see the retry comment in orthogonalizer.proto).
inline constexpr char kRetryableKey[] = "orthoserve-retryable";
inline constexpr char kRetryableFleetChange[] = "fleet-change";
// Trailing metadata of a transient RESOURCE_EXHAUSTED (common/retry_after.h): whole milliseconds
// after which a retry may succeed. Without it, RESOURCE_EXHAUSTED is final.
inline constexpr char kRetryAfterKey[] = "orthoserve-retry-after-ms";

// "OK", "INVALID_ARGUMENT", ... as used in metric labels.
inline std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace orthoserve
