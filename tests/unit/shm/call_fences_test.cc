// CallFences: a fenced call takes no more holds, a fence answers once the call's holds are gone
// (or at its deadline), ids are per tenant, and fenced ids are remembered for the retention and
// within the per-tenant bound.
#include "server/shm/call_fences.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::_;

CallFences::Options Clocked(absl::Time* now) {
  CallFences::Options o;
  o.now = [now] { return *now; };
  return o;
}

TEST(CallFencesTest, AFenceOfAnIdleOrUnknownCallAnswersAtOnceAndRefusesItsLaterHolds) {
  CallFences fences({});
  ASSERT_OK(fences.Fence("t", "never-seen", absl::Now() + absl::Seconds(5)));
  EXPECT_THAT(fences.Take("t", "never-seen").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("was fenced")));
  {
    absl::StatusOr<CallFences::Hold> hold = fences.Take("t", "c1");
    ASSERT_OK(hold.status());
    EXPECT_EQ(fences.holds("t", "c1"), 1);
  }
  EXPECT_EQ(fences.holds("t", "c1"), 0);
  ASSERT_OK(fences.Fence("t", "c1", absl::Now() + absl::Seconds(5)));
  EXPECT_THAT(fences.Take("t", "c1").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  EXPECT_EQ(fences.fenced(), 2);
}

TEST(CallFencesTest, AFenceWaitsForEveryHoldOfItsCall) {
  CallFences fences({});
  std::vector<CallFences::Hold> holds;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<CallFences::Hold> hold = fences.Take("t", "c");
    ASSERT_OK(hold.status());
    holds.push_back(*std::move(hold));
  }
  absl::StatusOr<CallFences::Hold> other = fences.Take("t", "other");  // Another call: not waited for.
  ASSERT_OK(other.status());
  absl::Notification fenced;
  absl::Status status;
  std::thread fencer([&] {
    status = fences.Fence("t", "c", absl::Now() + absl::Seconds(30));
    fenced.Notify();
  });
  holds[0].Release();
  holds[1] = CallFences::Hold();  // Moved over: released too.
  EXPECT_FALSE(fenced.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_THAT(fences.Take("t", "c").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  holds.clear();  // The last one, from another thread than the fencer's.
  EXPECT_TRUE(fenced.WaitForNotificationWithTimeout(absl::Seconds(10)));
  fencer.join();
  EXPECT_OK(status);
  EXPECT_EQ(fences.holds("t", "c"), 0);
  EXPECT_EQ(fences.holds("t", "other"), 1);
}

TEST(CallFencesTest, AFenceStillHeldAtItsDeadlineIsDeadlineExceededAndStaysFenced) {
  CallFences fences({});
  absl::StatusOr<CallFences::Hold> hold = fences.Take("t", "c");
  ASSERT_OK(hold.status());
  const absl::Time start = absl::Now();
  EXPECT_THAT(fences.Fence("t", "c", start + absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("still holds 1 region slice")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_THAT(fences.Take("t", "c").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  hold->Release();
  EXPECT_OK(fences.Fence("t", "c", absl::Now() + absl::Seconds(5)));
}

TEST(CallFencesTest, IdsArePerTenantAndAnEmptyIdIsNeverFenced) {
  CallFences fences({});
  ASSERT_OK(fences.Fence("a", "c", absl::Now()));
  EXPECT_OK(fences.Take("b", "c").status());  // Tenant b's call "c" is another call.
  absl::StatusOr<CallFences::Hold> none = fences.Take("a", "");
  ASSERT_OK(none.status());  // No id: nothing counted, nothing to refuse.
  EXPECT_EQ(fences.holds("a", ""), 0);
  EXPECT_THAT(fences.Fence("a", "", absl::Now()), StatusIs(absl::StatusCode::kInvalidArgument, _));
  // Tenant and id are not confused by concatenation.
  ASSERT_OK(fences.Fence("ab", "c", absl::Now()));
  EXPECT_OK(fences.Take("a", "bc").status());
}

TEST(CallFencesTest, FencedIdsAreRememberedForTheRetentionAfterTheirLastHold) {
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  CallFences::Options options = Clocked(&now);
  options.retention = absl::Minutes(10);
  CallFences fences(options);
  absl::StatusOr<CallFences::Hold> hold = fences.Take("t", "busy");
  ASSERT_OK(hold.status());
  ASSERT_THAT(fences.Fence("t", "busy", absl::Now() + absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  ASSERT_OK(fences.Fence("t", "idle", absl::Now()));
  now += absl::Minutes(11);
  ASSERT_OK(fences.Fence("t", "later", absl::Now()));  // Prunes: "idle" is forgotten; "busy" is held.
  EXPECT_OK(fences.Take("t", "idle").status());
  EXPECT_THAT(fences.Take("t", "busy").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  hold->Release();  // Its retention starts now.
  now += absl::Minutes(9);
  ASSERT_OK(fences.Fence("t", "later2", absl::Now()));
  EXPECT_THAT(fences.Take("t", "busy").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  now += absl::Minutes(2);
  ASSERT_OK(fences.Fence("t", "later3", absl::Now()));
  EXPECT_OK(fences.Take("t", "busy").status());
}

TEST(CallFencesTest, ATenantKeepsAtMostItsBoundOfFencedIdsAndOthersKeepTheirs) {
  absl::Time now = absl::UnixEpoch();
  CallFences::Options options = Clocked(&now);
  options.max_fenced_per_tenant = 3;
  CallFences fences(options);
  ASSERT_OK(fences.Fence("other", "x", absl::Now()));
  for (int i = 0; i < 5; ++i) ASSERT_OK(fences.Fence("t", absl::StrCat("c", i), absl::Now()));
  EXPECT_EQ(fences.fenced(), 4);  // Three of t's, one of other's.
  EXPECT_OK(fences.Take("t", "c0").status());  // The oldest two were forgotten.
  EXPECT_OK(fences.Take("t", "c1").status());
  EXPECT_THAT(fences.Take("t", "c2").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  EXPECT_THAT(fences.Take("other", "x").status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
}

}  // namespace
}  // namespace orthoserve
