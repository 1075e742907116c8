// server/rpc/admission.h: stream slots per server and per tenant, in-flight bytes per server and
// per tenant; every refusal RESOURCE_EXHAUSTED naming the limit, the figure and the limit's value;
// everything given back when tickets go.
#include "server/rpc/admission.h"

#include <vector>

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
  // A closed stream gives its slot back to its tenant and to the server.
  alice.pop_back();
  EXPECT_OK(admission.AcquireStream("alice"));  // Released again at once (a temporary).
  carol->Release();
  EXPECT_OK(admission.AcquireStream("dave"));
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

}  // namespace
}  // namespace orthoserve
