// grpc.health.v1.Health/Check without generated stubs: Debian's gRPC packages ship neither
// health.proto nor its generated C++ code, so the call goes through grpc::GenericStub with the two
// tiny messages encoded and decoded by hand (HealthCheckRequest{string service = 1},
// HealthCheckResponse{ServingStatus status = 1}).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace orthoserve::client {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

absl::string_view ServingStatusName(ServingStatus status);

// Wire encodings of the two messages (exposed for tests).
std::string EncodeHealthCheckRequest(absl::string_view service);
// INTERNAL for bytes that are not a valid HealthCheckResponse. Unknown fields are skipped; an
// absent status field is UNKNOWN (proto3 default); unknown enum values map to kUnknown.
absl::StatusOr<ServingStatus> DecodeHealthCheckResponse(absl::string_view bytes);

// Calls Check on `channel` with `context` (deadline and metadata set by the caller). Returns the
// serving status, or the call's status when the RPC fails.
absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                                          absl::string_view service);

}  // namespace orthoserve::client
