// Test helpers for absl::Status: EXPECT_OK / ASSERT_OK, StatusIs(code, message_matcher) and
// IsOkAndHolds(value_matcher).
//
//   EXPECT_THAT(Validate(x), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps")));
#pragma once

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoserve::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "which is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()), result_listener);
}

// Matches an OK absl::StatusOr whose value matches `inner`.
MATCHER_P(IsOkAndHolds, inner, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "which is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(inner, *arg, result_listener);
}

}  // namespace orthoserve::testing

#define EXPECT_OK(expr)                                                          \
  do {                                                                           \
    const auto& orthoserve_expect_ok_ = (expr);                                  \
    EXPECT_TRUE(::orthoserve::testing::GetStatus(orthoserve_expect_ok_).ok())    \
        << ::orthoserve::testing::GetStatus(orthoserve_expect_ok_);              \
  } while (false)
#define ASSERT_OK(expr)                                                          \
  do {                                                                           \
    const auto& orthoserve_assert_ok_ = (expr);                                  \
    ASSERT_TRUE(::orthoserve::testing::GetStatus(orthoserve_assert_ok_).ok())    \
        << ::orthoserve::testing::GetStatus(orthoserve_assert_ok_);              \
  } while (false)
