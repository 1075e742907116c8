// Implementation of proto/convert/grpc_status.h.
#include "proto/convert/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace orthoserve {
namespace {

#define ORTHOSERVE_SAME_CODE(grpc_code, absl_code)                                                              \
  static_assert(static_cast<int>(grpc::StatusCode::grpc_code) == static_cast<int>(absl::StatusCode::absl_code), \
                "grpc and absl disagree on " #grpc_code)
ORTHOSERVE_SAME_CODE(OK, kOk);
ORTHOSERVE_SAME_CODE(CANCELLED, kCancelled);
ORTHOSERVE_SAME_CODE(UNKNOWN, kUnknown);
ORTHOSERVE_SAME_CODE(INVALID_ARGUMENT, kInvalidArgument);
ORTHOSERVE_SAME_CODE(DEADLINE_EXCEEDED, kDeadlineExceeded);
ORTHOSERVE_SAME_CODE(NOT_FOUND, kNotFound);
ORTHOSERVE_SAME_CODE(ALREADY_EXISTS, kAlreadyExists);
ORTHOSERVE_SAME_CODE(PERMISSION_DENIED, kPermissionDenied);
ORTHOSERVE_SAME_CODE(RESOURCE_EXHAUSTED, kResourceExhausted);
ORTHOSERVE_SAME_CODE(FAILED_PRECONDITION, kFailedPrecondition);
ORTHOSERVE_SAME_CODE(ABORTED, kAborted);
ORTHOSERVE_SAME_CODE(OUT_OF_RANGE, kOutOfRange);
ORTHOSERVE_SAME_CODE(UNIMPLEMENTED, kUnimplemented);
ORTHOSERVE_SAME_CODE(INTERNAL, kInternal);
ORTHOSERVE_SAME_CODE(UNAVAILABLE, kUnavailable);
ORTHOSERVE_SAME_CODE(DATA_LOSS, kDataLoss);
ORTHOSERVE_SAME_CODE(UNAUTHENTICATED, kUnauthenticated);
#undef ORTHOSERVE_SAME_CODE

constexpr int kMaxCanonicalCode = static_cast<int>(absl::StatusCode::kUnauthenticated);

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return StatusFromCode(static_cast<int>(status.error_code()), status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status StatusFromCode(int code, const std::string& message) {
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > kMaxCanonicalCode) {
    return absl::UnknownError(absl::StrCat("(code ", code, ") ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

}  // namespace orthoserve
