// server/rpc/admission.h: stream slots per server and per tenant, in-flight bytes per server and
// per tenant; every refusal RESOURCE_EXHAUSTED naming the limit, the figure and the limit's value;
// everything given back when tickets go.
#include "server/rpc/admission.h"

#include <vector>

#include "common/retry_after.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(AdmissionTest, OneTenantsStreamsCannotTakeAnothersSlots) {
  Admission::Options options;
  options.max_concurrent_streams = 5;
  options.max_tenant_concurrent_streams = 2;
  Admission admission(options, nullptr);
  std::vector<Admission::Ticket> alice;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Admission::Ticket> t = admission.AcquireStream("alice");
    ASSERT_OK(t);
    alice.push_back(*std::move(t));
  }
  EXPECT_THAT(admission.AcquireStream("alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant \"alice\" has 2 streams open"), HasSubstr("its limit of 2"),
                             HasSubstr("--max-tenant-concurrent-streams"))));
  // Bob is not affected, up to the server-wide limit.
  std::vector<Admission::Ticket> bob;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Admission::Ticket> t = admission.AcquireStream("bob");
    ASSERT_OK(t);
    bob.push_back(*std::move(t));
  }
  absl::StatusOr<Admission::Ticket> carol = admission.AcquireStream("carol");
  ASSERT_OK(carol);
  EXPECT_THAT(admission.AcquireStream("dave"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("serving 5 streams, its limit of 5"), HasSubstr("--max-concurrent-streams"))));
  // A closed stream gives its slot back to its tenant and to the server; dave, refused a moment
  // ago and under his fair share (5 slots / 4 tenants: 1), gets it before alice, who holds her
  // share already (fair slots, admission.h).
  alice.pop_back();
  EXPECT_THAT(admission.AcquireStream("alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant \"alice\" has 1 streams open and its fair share is 1"),
                             HasSubstr("kept for 1 other tenants waiting"))));
  absl::StatusOr<Admission::Ticket> dave = admission.AcquireStream("dave");
  ASSERT_OK(dave);
  carol->Release();
  EXPECT_OK(admission.AcquireStream("alice"));
}

TEST(AdmissionTest, NoPerTenantStreamLimitByDefault) {
  Admission::Options options;
  options.max_concurrent_streams = 3;
  Admission admission(options, nullptr);
  std::vector<Admission::Ticket> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Admission::Ticket> t = admission.AcquireStream("only");
    ASSERT_OK(t);
    held.push_back(*std::move(t));
  }
  EXPECT_THAT(admission.AcquireStream("only"), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-concurrent-streams")));
}

TEST(AdmissionTest, BytesPerServerAndPerTenantNameTheirLimits) {
  Admission::Options options;
  options.max_inflight_bytes = 100;
  options.max_tenant_inflight_bytes = 60;
  Admission admission(options, nullptr);
  Admission::Ticket a, b;
  ASSERT_OK(admission.AddBytes(a, "alice", 50, "step 1"));
  EXPECT_THAT(admission.AddBytes(a, "alice", 20, "matrix 3"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("matrix 3 needs 20 bytes but tenant \"alice\" holds 50 of its 60"),
                             HasSubstr("--max-tenant-inflight-bytes"))));
  ASSERT_OK(admission.AddBytes(b, "bob", 40, "step 2"));
  EXPECT_THAT(admission.AddBytes(b, "bob", 20, "matrix 1"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("the server holds 90 of its 100"), HasSubstr("--max-inflight-bytes"))));
  EXPECT_EQ(admission.inflight_bytes(), 90);
  a.Release();
  EXPECT_EQ(admission.inflight_bytes(), 40);
  ASSERT_OK(admission.AddBytes(b, "bob", 20, "matrix 1"));
  // A ticket belongs to one tenant.
  EXPECT_THAT(admission.AddBytes(b, "alice", 1, "x"), StatusIs(absl::StatusCode::kInternal, HasSubstr("ticket of tenant \"bob\" used for tenant \"alice\"")));
}

TEST(AdmissionTest, WaitersGetReleasedBytesInArrivalOrder) {
  Admission::Options options;
  options.max_inflight_bytes = 100;
  options.max_tenant_inflight_bytes = 80;
  Admission admission(options, nullptr);
  Admission::Ticket held;
  ASSERT_OK(admission.AddBytes(held, "alice", 70, "held"));

  std::vector<std::string> order;
  std::vector<absl::Status> results(4);
  Admission::Ticket a, b, c, d;
  // 40 does not fit beside 70: it waits, and so does everything after it, even what would fit.
  EXPECT_NE(admission.AddBytesWhenAvailable(&a, "bob", 40, "a", [&](absl::Status s) { order.push_back("a"); results[0] = s; }), 0u);
  EXPECT_NE(admission.AddBytesWhenAvailable(&b, "carol", 10, "b", [&](absl::Status s) { order.push_back("b"); results[1] = s; }), 0u);
  const uint64_t cancelled =
      admission.AddBytesWhenAvailable(&c, "dave", 10, "c", [&](absl::Status s) { order.push_back("c"); results[2] = s; });
  // Alice's own limit (80) refuses at once rather than waiting: 70 + 20 > 80.
  Admission::Ticket own;
  EXPECT_EQ(admission.AddBytesWhenAvailable(&own, "alice", 20, "own", [&](absl::Status s) { results[3] = s; }), 0u);
  EXPECT_THAT(results[3], StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-tenant-inflight-bytes")));
  EXPECT_EQ(admission.waiting(), 3u);
  EXPECT_TRUE(admission.CancelWait(cancelled));
  EXPECT_FALSE(admission.CancelWait(cancelled));
  EXPECT_TRUE(order.empty());

  held.Release();  // 100 free: a (40) and b (10) in order; c was cancelled.
  EXPECT_THAT(order, ::testing::ElementsAre("a", "b"));
  EXPECT_OK(results[0]);
  EXPECT_OK(results[1]);
  EXPECT_EQ(a.bytes(), 40);
  EXPECT_EQ(b.bytes(), 10);
  EXPECT_EQ(admission.inflight_bytes(), 50);
  EXPECT_EQ(admission.waiting(), 0u);

  // More than the whole budget can never fit: refused at once.
  Admission::Ticket huge;
  absl::Status refused;
  EXPECT_EQ(admission.AddBytesWhenAvailable(&huge, "erin", 101, "huge", [&](absl::Status s) { refused = s; }), 0u);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-inflight-bytes")));
}

TEST(AdmissionTest, ResizeShrinksFreelyAndGrowsWithinTheLimits) {
  Admission::Options options;
  options.max_inflight_bytes = 100;
  Admission admission(options, nullptr);
  Admission::Ticket t;
  ASSERT_OK(admission.AddBytes(t, "alice", 60, "reservation"));
  Admission::Ticket waiter;
  bool granted = false;
  admission.AddBytesWhenAvailable(&waiter, "bob", 70, "w", [&](absl::Status s) { granted = s.ok(); });
  EXPECT_FALSE(granted);
  ASSERT_OK(admission.Resize(t, "alice", 25, "actual"));  // Shrinking returns 35 bytes: the waiter fits.
  EXPECT_TRUE(granted);
  EXPECT_EQ(t.bytes(), 25);
  EXPECT_EQ(admission.inflight_bytes(), 95);
  EXPECT_THAT(admission.Resize(t, "alice", 40, "actual"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-inflight-bytes")));
  EXPECT_EQ(t.bytes(), 25);
  t.Release();
  waiter.Release();
  EXPECT_EQ(admission.inflight_bytes(), 0);
}

TEST(AdmissionTest, CallRatePerTenantNamesTheCountAndTheLimit) {
  Admission::Options options;
  options.max_tenant_calls_per_second = 3;
  Admission admission(options, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_OK(admission.AdmitCall("alice"));
  EXPECT_THAT(admission.AdmitCall("alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant \"alice\" started 3 calls in the last second"),
                             HasSubstr("its limit of 3 per second"), HasSubstr("--max-tenant-calls-per-second"))));
  // Another tenant is not affected; a second later alice may start calls again.
  EXPECT_OK(admission.AdmitCall("bob"));
  absl::SleepFor(absl::Milliseconds(1050));
  EXPECT_OK(admission.AdmitCall("alice"));
  // No limit by default.
  Admission unlimited(Admission::Options{}, nullptr);
  for (int i = 0; i < 1000; ++i) ASSERT_OK(unlimited.AdmitCall("alice"));
}

// Refusals a wait can cure carry the retry delay both clients honour (common/retry_after.h); a
// request larger than a limit itself does not, and stays final.
TEST(AdmissionTest, TransientRefusalsCarryARetryDelayAndPermanentOnesDoNot) {
  Admission::Options options;
  options.max_concurrent_streams = 1;
  options.max_inflight_bytes = 100;
  options.max_tenant_inflight_bytes = 60;
  options.max_tenant_calls_per_second = 1;
  Admission admission(options, nullptr);
  absl::StatusOr<Admission::Ticket> stream = admission.AcquireStream("alice");
  ASSERT_OK(stream);
  EXPECT_EQ(RetryAfter(admission.AcquireStream("bob").status()), kBusyRetryAfter);  // The slots.
  Admission::Ticket a, b;
  ASSERT_OK(admission.AddBytes(a, "alice", 50, "step 1"));
  EXPECT_EQ(RetryAfter(admission.AddBytes(a, "alice", 20, "m")), kBusyRetryAfter);  // The tenant's bytes.
  ASSERT_OK(admission.AddBytes(b, "bob", 40, "step 2"));
  EXPECT_EQ(RetryAfter(admission.AddBytes(b, "bob", 20, "m")), kBusyRetryAfter);  // The server's bytes.
  Admission::Ticket c;
  const absl::Status too_big = admission.AddBytes(c, "carol", 150, "m");  // Over the server's whole limit.
  EXPECT_THAT(too_big, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-inflight-bytes")));
  EXPECT_EQ(RetryAfter(too_big), std::nullopt);
  ASSERT_OK(admission.AdmitCall("alice"));
  const absl::Status rate = admission.AdmitCall("alice");  // The rest of alice's second.
  ASSERT_TRUE(RetryAfter(rate).has_value());
  EXPECT_GT(*RetryAfter(rate), absl::ZeroDuration());
  EXPECT_LE(*RetryAfter(rate), absl::Seconds(1));
}

}  // namespace
}  // namespace orthoserve
