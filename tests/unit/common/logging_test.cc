// Log level and per-subsystem verbosity parsing of common/logging.h.
#include "common/logging.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;

TEST(Logging, VerbosityPerSubsystem) {
  ASSERT_OK(SetLogVerbosity("rpc=2,fleet=1"));
  EXPECT_EQ(GetLogVerbosity("rpc"), 2);
  EXPECT_EQ(GetLogVerbosity("fleet"), 1);
  EXPECT_EQ(GetLogVerbosity("engine"), 0);
  EXPECT_THAT(SetLogVerbosity("rpc=x"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("SUBSYSTEM=N")));
  ASSERT_OK(SetLogVerbosity(""));
  EXPECT_EQ(GetLogVerbosity("rpc"), 0);
}

TEST(Logging, Levels) {
  LogLevel level;
  ASSERT_OK(ParseLogLevel("warning", &level));
  EXPECT_EQ(level, LogLevel::kWarning);
  EXPECT_THAT(ParseLogLevel("loud", &level), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("debug")));
  SetLogLevel(LogLevel::kError);
  int evaluated = 0;
  LOG_INFO("test") << (++evaluated);
  EXPECT_EQ(evaluated, 0);  // Disabled lines do not evaluate their arguments.
  SetLogLevel(LogLevel::kInfo);
  LOG_INFO("test") << "visible " << (++evaluated);
  EXPECT_EQ(evaluated, 1);
}

}  // namespace
}  // namespace orthoserve
