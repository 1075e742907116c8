// Hand encoding of grpc.health.v1 messages in client/cpp/health.h.
#include <string>

#include "client/cpp/health.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(HealthCodec, RequestEncoding) {
  EXPECT_EQ(EncodeHealthCheckRequest(""), "");
  EXPECT_EQ(EncodeHealthCheckRequest("abc"), std::string("\x0a\x03"
                                                         "abc",
                                                         5));
  const std::string long_name(200, 'x');
  const std::string encoded = EncodeHealthCheckRequest(long_name);
  EXPECT_EQ(encoded.substr(0, 3), std::string("\x0a\xc8\x01", 3));  // Varint 200.
  EXPECT_EQ(encoded.substr(3), long_name);
}

TEST(HealthCodec, ResponseDecoding) {
  auto serving = DecodeHealthCheckResponse(std::string("\x08\x01", 2));
  ASSERT_OK(serving);
  EXPECT_EQ(*serving, ServingStatus::kServing);
  auto not_serving = DecodeHealthCheckResponse(std::string("\x08\x02", 2));
  ASSERT_OK(not_serving);
  EXPECT_EQ(*not_serving, ServingStatus::kNotServing);
  auto empty = DecodeHealthCheckResponse("");
  ASSERT_OK(empty);
  EXPECT_EQ(*empty, ServingStatus::kUnknown);
  // An unknown length-delimited field 2 before the status is skipped.
  auto skipped = DecodeHealthCheckResponse(std::string("\x12\x02xy\x08\x01", 6));
  ASSERT_OK(skipped);
  EXPECT_EQ(*skipped, ServingStatus::kServing);
  auto future = DecodeHealthCheckResponse(std::string("\x08\x09", 2));
  ASSERT_OK(future);
  EXPECT_EQ(*future, ServingStatus::kUnknown);
}

TEST(HealthCodec, MalformedResponses) {
  EXPECT_THAT(DecodeHealthCheckResponse(std::string("\x08", 1)),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("HealthCheckResponse")));
  EXPECT_THAT(DecodeHealthCheckResponse(std::string("\x12\x05xy", 4)),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("HealthCheckResponse")));
  EXPECT_EQ(ServingStatusName(ServingStatus::kNotServing), "NOT_SERVING");
}

}  // namespace
}  // namespace orthoserve::client
