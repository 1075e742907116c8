// grpc::Status <-> absl::Status mapping of proto/convert/grpc_status.h.
#include "proto/convert/grpc_status.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(GrpcStatus, EveryCanonicalCodeRoundTrips) {
  for (int code = 0; code <= 16; ++code) {
    const std::string message = code == 0 ? "" : "message " + std::to_string(code);
    grpc::Status g(static_cast<grpc::StatusCode>(code), message);
    absl::Status a = FromGrpcStatus(g);
    EXPECT_EQ(static_cast<int>(a.code()), code);
    EXPECT_EQ(std::string(a.message()), message);
    grpc::Status back = ToGrpcStatus(a);
    EXPECT_EQ(back.error_code(), g.error_code());
    EXPECT_EQ(back.error_message(), message);
  }
}

TEST(GrpcStatus, KeepsTheServersMessage) {
  EXPECT_THAT(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "over 1 GiB in flight")),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("over 1 GiB in flight")));
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(GrpcStatus, WireCodes) {
  EXPECT_TRUE(StatusFromCode(0, "").ok());
  EXPECT_THAT(StatusFromCode(3, "bad steps"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad steps")));
  EXPECT_THAT(StatusFromCode(99, "odd"), StatusIs(absl::StatusCode::kUnknown, HasSubstr("(code 99) odd")));
  EXPECT_THAT(StatusFromCode(-1, "neg"), StatusIs(absl::StatusCode::kUnknown, HasSubstr("(code -1)")));
}

}  // namespace
}  // namespace orthoserve::client
