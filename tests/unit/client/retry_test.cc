// The retry policy without a network: which failures are retryable, the option checks, and the
// backoff, deadline and give-up behaviour of RetryLoop on a fake clock.
#include "client/cpp/retry.h"

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "common/retry_after.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/fake_retry_environment.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::client::testing::FakeRetryEnvironment;
using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(IsRetryable, GrpcCodesAndTrailingMetadata) {
  const Metadata none;
  Metadata fleet_change;
  fleet_change.emplace("orthoserve-retryable", "fleet-change");
  Metadata other_value;
  other_value.emplace("orthoserve-retryable", "maybe");
  Metadata other_key;
  other_key.emplace("x-retryable", "fleet-change");

  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"), none));
  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::ABORTED, "fleet changed"), fleet_change));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::ABORTED, "rendezvous timeout"), none));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::ABORTED, "x"), other_value));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::ABORTED, "x"), other_key));
  // The server cancelled the call (the client never does so on a call whose status it reports).
  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED"), none));
  for (grpc::StatusCode code :
       {grpc::StatusCode::OK, grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::RESOURCE_EXHAUSTED,
        grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::FAILED_PRECONDITION,
        grpc::StatusCode::INTERNAL, grpc::StatusCode::UNAUTHENTICATED}) {
    EXPECT_FALSE(IsRetryable(grpc::Status(code, "final"), fleet_change)) << code;
  }
}

TEST(IsRetryable, TheMarkSurvivesConversionAndAnnotation) {
  Metadata fleet_change;
  fleet_change.emplace("orthoserve-retryable", "fleet-change");
  const absl::Status marked = FromCallStatus(grpc::Status(grpc::StatusCode::ABORTED, "cut short"), fleet_change);
  EXPECT_THAT(marked, StatusIs(absl::StatusCode::kAborted, "cut short"));
  EXPECT_TRUE(IsRetryable(marked));
  const absl::Status annotated = AnnotateKeepingMarks(marked, "step 3");
  EXPECT_THAT(annotated, StatusIs(absl::StatusCode::kAborted, "step 3: cut short"));
  EXPECT_TRUE(IsRetryable(annotated));

  EXPECT_FALSE(IsRetryable(FromCallStatus(grpc::Status(grpc::StatusCode::ABORTED, "timeout"), Metadata())));
  EXPECT_TRUE(IsRetryable(FromCallStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone"), Metadata())));
  EXPECT_TRUE(IsRetryable(FromCallStatus(grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED"), Metadata())));
  EXPECT_FALSE(IsRetryable(FromCallStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"), fleet_change)));
  EXPECT_OK(FromCallStatus(grpc::Status::OK, fleet_change));
  EXPECT_TRUE(IsRetryable(MarkFleetChange(absl::AbortedError("x"))));
  EXPECT_FALSE(IsRetryable(MarkFleetChange(absl::InvalidArgumentError("x"))));  // The code decides first.
  EXPECT_FALSE(IsRetryable(absl::AbortedError("plain")));
  EXPECT_FALSE(IsRetryable(absl::DeadlineExceededError("late")));
}

// A transient RESOURCE_EXHAUSTED (a fair share or a limit used up for a moment) carries the
// server's delay; without it RESOURCE_EXHAUSTED is final (a request larger than any limit).
TEST(IsRetryable, ResourceExhaustedWithTheServersDelayOnly) {
  Metadata delay;
  delay.emplace("orthoserve-retry-after-ms", "250");
  Metadata garbage;
  garbage.emplace("orthoserve-retry-after-ms", "soon");
  Metadata too_long;
  too_long.emplace("orthoserve-retry-after-ms", "3600000");
  const grpc::Status busy(grpc::StatusCode::RESOURCE_EXHAUSTED, "fair share used up; retry later");
  EXPECT_TRUE(IsRetryable(busy, delay));
  EXPECT_FALSE(IsRetryable(busy, Metadata()));
  EXPECT_FALSE(IsRetryable(busy, garbage));
  EXPECT_FALSE(IsRetryable(busy, too_long));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"), delay));  // The code first.

  const absl::Status marked = FromCallStatus(busy, delay);
  EXPECT_THAT(marked, StatusIs(absl::StatusCode::kResourceExhausted, "fair share used up; retry later"));
  EXPECT_EQ(RetryAfter(marked), absl::Milliseconds(250));
  EXPECT_TRUE(IsRetryable(AnnotateKeepingMarks(marked, "step 4")));
  EXPECT_FALSE(IsRetryable(FromCallStatus(busy, Metadata())));
  EXPECT_FALSE(IsRetryable(absl::ResourceExhaustedError("too large for any limit")));
}

TEST(RetryLoop, ATransientRefusalWaitsAtLeastTheServersDelay) {
  FakeRetryEnvironment env(0.5);
  RetryOptions o;
  RetryLoop loop(o, &env, absl::Seconds(60), "test call", nullptr);
  const absl::Status busy = MarkRetryAfter(absl::ResourceExhaustedError("busy"), absl::Milliseconds(700));
  ASSERT_TRUE(loop.BackOff(busy));                                  // Bound 100 ms: half is 50 ms, below 700.
  ASSERT_TRUE(loop.BackOff(absl::UnavailableError("rank lost")));   // No delay asked: the jitter alone.
  EXPECT_THAT(env.sleeps(), ElementsAre(absl::Milliseconds(700), absl::Milliseconds(100)));
  EXPECT_FALSE(loop.BackOff(absl::ResourceExhaustedError("final")));  // Unmarked: not retried.
}

TEST(RetryOptions, Validation) {
  EXPECT_OK(ValidateRetryOptions(RetryOptions()));
  RetryOptions o;
  o.deadline = absl::ZeroDuration();
  EXPECT_THAT(ValidateRetryOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deadline")));
  o = RetryOptions();
  o.initial_backoff = absl::Milliseconds(-1);
  EXPECT_THAT(ValidateRetryOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  o = RetryOptions();
  o.max_backoff = absl::Milliseconds(10);
  EXPECT_THAT(ValidateRetryOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("raise max_backoff")));
  o = RetryOptions();
  o.multiplier = 0.5;
  EXPECT_THAT(ValidateRetryOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiplier")));
  o = RetryOptions();
  o.max_attempts = -1;
  EXPECT_THAT(ValidateRetryOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_attempts")));
  o = RetryOptions();
  o.deadline = absl::InfiniteDuration();
  EXPECT_OK(ValidateRetryOptions(o));
}

TEST(RetryLoop, BackoffBoundsGrowToTheCapAndTheDeadlineEndsIt) {
  FakeRetryEnvironment env(0.5);
  RetryOptions o;
  o.deadline = absl::Seconds(5);
  std::atomic<int64_t> retries{0};
  RetryLoop loop(o, &env, absl::Seconds(60), "test call", &retries);
  const absl::Status unavailable = absl::UnavailableError("rank lost");
  int attempts = 1;
  while (loop.BackOff(unavailable)) ++attempts;
  // Bounds 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2, 2 s; waits half of each, ending at 4.55 s. A ninth
  // wait (1 s) would end past the 5 s deadline.
  EXPECT_THAT(env.sleeps(), ElementsAre(absl::Milliseconds(50), absl::Milliseconds(100), absl::Milliseconds(200),
                                        absl::Milliseconds(400), absl::Milliseconds(800), absl::Seconds(1),
                                        absl::Seconds(1), absl::Seconds(1)));
  EXPECT_EQ(env.bounds().back(), absl::Seconds(2));  // Capped.
  EXPECT_EQ(attempts, 9);
  EXPECT_EQ(loop.attempt(), 8);
  EXPECT_EQ(retries.load(), 8);
  EXPECT_THAT(loop.GiveUp(unavailable),
              StatusIs(absl::StatusCode::kUnavailable, "after 9 attempts (retry deadline of 5s reached): rank lost"));
}

TEST(RetryLoop, AttemptTimeoutIsCutToWhatRemainsAfterTheFirst) {
  FakeRetryEnvironment env(1.0);
  RetryOptions o;
  o.deadline = absl::Seconds(10);
  RetryLoop loop(o, &env, absl::Seconds(30), "test call", nullptr);
  EXPECT_EQ(loop.AttemptTimeout(), absl::Seconds(30));  // The first attempt keeps the whole timeout.
  env.Advance(absl::Seconds(7));
  ASSERT_TRUE(loop.BackOff(absl::UnavailableError("x")));  // Waits 0.1 s.
  EXPECT_EQ(loop.AttemptTimeout(), absl::Milliseconds(2900));
  RetryLoop short_calls(o, &env, absl::Seconds(1), "test call", nullptr);
  ASSERT_TRUE(short_calls.BackOff(absl::UnavailableError("x")));
  EXPECT_EQ(short_calls.AttemptTimeout(), absl::Seconds(1));
}

TEST(RetryLoop, FinalCodesAreNotRetriedAndKeepTheirMessage) {
  FakeRetryEnvironment env;
  std::atomic<int64_t> retries{0};
  RetryLoop loop(RetryOptions(), &env, absl::Seconds(1), "test call", &retries);
  for (const absl::Status& s : {absl::AbortedError("rendezvous timeout"), absl::InvalidArgumentError("bad"),
                                absl::ResourceExhaustedError("full"), absl::CancelledError("stop"),
                                absl::DeadlineExceededError("late"), absl::OkStatus()}) {
    EXPECT_FALSE(loop.BackOff(s)) << s;
    EXPECT_EQ(loop.GiveUp(s), s);  // One attempt: unchanged.
  }
  EXPECT_EQ(retries.load(), 0);
  EXPECT_TRUE(env.sleeps().empty());
  ASSERT_TRUE(loop.BackOff(MarkFleetChange(absl::AbortedError("fleet changed"))));
  EXPECT_THAT(loop.GiveUp(absl::InvalidArgumentError("bad")),
              StatusIs(absl::StatusCode::kInvalidArgument, "after 2 attempts: bad"));
}

TEST(RetryLoop, DisabledAndMaxAttempts) {
  FakeRetryEnvironment env;
  RetryOptions off;
  off.enabled = false;
  RetryLoop disabled(off, &env, absl::Seconds(1), "test call", nullptr);
  EXPECT_FALSE(disabled.BackOff(absl::UnavailableError("gone")));
  EXPECT_THAT(disabled.GiveUp(absl::UnavailableError("gone")), StatusIs(absl::StatusCode::kUnavailable, "gone"));

  RetryOptions three;
  three.max_attempts = 3;
  RetryLoop limited(three, &env, absl::Seconds(1), "test call", nullptr);
  int attempts = 1;
  while (limited.BackOff(absl::UnavailableError("gone"))) ++attempts;
  EXPECT_EQ(attempts, 3);
  EXPECT_THAT(limited.GiveUp(absl::UnavailableError("gone")),
              StatusIs(absl::StatusCode::kUnavailable, "after 3 attempts (max_attempts 3 reached): gone"));
}

TEST(SystemRetryEnvironment, JitterStaysWithinTheBound) {
  std::shared_ptr<RetryEnvironment> env = MakeSystemRetryEnvironment();
  for (int i = 0; i < 100; ++i) {
    const absl::Duration d = env->Jitter(absl::Milliseconds(5));
    EXPECT_GE(d, absl::ZeroDuration());
    EXPECT_LE(d, absl::Milliseconds(5));
  }
  EXPECT_EQ(env->Jitter(absl::ZeroDuration()), absl::ZeroDuration());
}

}  // namespace
}  // namespace orthoserve::client
