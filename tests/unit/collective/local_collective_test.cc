// Tests of LocalCollective: world 1 copies, argument checks and the broken-after-error rule.
#include "server/collective/local_collective.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(1);

TEST(LocalCollectiveTest, IdentityAndCopies) {
  LocalCollective local;
  EXPECT_EQ(local.rank(), 0);
  EXPECT_EQ(local.world(), 1);
  EXPECT_EQ(local.name(), "local");
  EXPECT_TRUE(local.ReducesDeviceMemory());  // A sum over one rank touches nothing.
  EXPECT_FALSE(local.TakesDeviceMemory());   // Its exchanges copy with memcpy: host memory only.

  std::vector<uint8_t> send(37);
  std::iota(send.begin(), send.end(), 3);
  std::vector<uint8_t> recv(37, 0);
  const size_t bytes[] = {send.size()};
  ASSERT_OK(local.AllToAllv(send.data(), bytes, recv.data(), bytes, kTimeout));
  EXPECT_THAT(recv, ElementsAreArray(send));

  std::vector<uint8_t> gathered(37, 0);
  ASSERT_OK(local.AllGatherv(send.data(), send.size(), gathered.data(), bytes, kTimeout));
  EXPECT_THAT(gathered, ElementsAreArray(send));
  // In place.
  ASSERT_OK(local.AllGatherv(gathered.data(), gathered.size(), gathered.data(), bytes, kTimeout));
  EXPECT_THAT(gathered, ElementsAreArray(send));

  std::vector<float> f = {1.5f, -2.25f, 3e-8f};
  std::vector<double> d = {1e300, -0.0, 7.0};
  ASSERT_OK(local.AllReduceSum(absl::MakeSpan(f), kTimeout));
  ASSERT_OK(local.AllReduceSum(absl::MakeSpan(d), kTimeout));
  EXPECT_THAT(f, ElementsAreArray({1.5f, -2.25f, 3e-8f}));
  EXPECT_THAT(d, ElementsAreArray({1e300, -0.0, 7.0}));

  ASSERT_OK(local.Broadcast(send.data(), send.size(), 0, kTimeout));
  EXPECT_THAT(recv, ElementsAreArray(send));
  ASSERT_OK(local.Barrier(kTimeout));

  const size_t zero[] = {0};
  ASSERT_OK(local.AllToAllv(nullptr, zero, nullptr, zero, kTimeout));
}

TEST(LocalCollectiveTest, BadArgumentsBreakTheCollective) {
  LocalCollective local;
  uint8_t byte = 0;
  EXPECT_THAT(local.Broadcast(&byte, 1, 1, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 1")));
  EXPECT_THAT(local.Barrier(kTimeout), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("broken")));
  EXPECT_THAT(local.AllReduceSum(absl::Span<float>(), kTimeout),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("root 1")));
}

TEST(LocalCollectiveTest, MismatchedCountsAreInvalidArgument) {
  const size_t two[] = {1, 1};
  const size_t one[] = {1};
  const size_t other[] = {2};
  uint8_t buf[2] = {};
  {
    LocalCollective local;
    EXPECT_THAT(local.AllToAllv(buf, two, buf, one, kTimeout),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world = 1")));
  }
  {
    LocalCollective local;
    EXPECT_THAT(local.AllToAllv(buf, one, buf + 1, other, kTimeout),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("to itself")));
  }
  {
    LocalCollective local;
    EXPECT_THAT(local.AllGatherv(buf, 1, buf, other, kTimeout),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("recv_bytes[0] is 2")));
  }
}

}  // namespace
}  // namespace orthoserve
