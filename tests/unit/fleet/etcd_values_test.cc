// What a rank takes from etcd (server/fleet/wire/etcd_values.h) and the address check under it
// (server/fleet/logic/address.h): a leader value's rank must be inside the world and its address
// HOST:PORT, a leader or liveness key must be on a lease, a liveness key must name a rank of the
// fleet; anything else is refused with a specific code, never used. Pure functions, no etcd.
#include "server/fleet/wire/etcd_values.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/fleet/logic/address.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(CheckHostPortTest, TakesOnlyTheAddressesTheFleetWrites) {
  for (const char* good : {"127.0.0.1:7000", "rank-0.fleet.ml.svc:1", "host_1:65535", "[::1]:80",
                           "[fe80::1%eth0]:443", "[::ffff:10.0.0.1]:9"}) {
    EXPECT_TRUE(CheckHostPort(good).ok()) << good << ": " << CheckHostPort(good);
  }
  EXPECT_THAT(CheckHostPort(""), StatusIs(kInvalid, HasSubstr("is not HOST:PORT")));
  EXPECT_THAT(CheckHostPort(std::string(300, 'a') + ":1"), StatusIs(kInvalid, HasSubstr("is not HOST:PORT")));
  EXPECT_THAT(CheckHostPort("127.0.0.1"), StatusIs(kInvalid, HasSubstr("no :PORT")));
  for (const char* port : {"h:", "h:0", "h:65536", "h:080", "h:+80", "h:8 0", "h:99999999999"}) {
    EXPECT_THAT(CheckHostPort(port), StatusIs(kInvalid, HasSubstr("port is not a decimal number"))) << port;
  }
  for (const char* host : {":80", "unix:/tmp/s:80", "dns:///x:80", "a b:80", "a\n:80", "[::1:80", "[]:80",
                           "[1.2.3.4]:80", "[::1%]:80", "[::g]:80", "h\xff:80"}) {
    EXPECT_THAT(CheckHostPort(host), StatusIs(kInvalid, HasSubstr("host"))) << host;
  }
}

TEST(ParseLeaderValueTest, ARankOutsideTheWorldOrAnUnusableAddressIsRefused) {
  absl::StatusOr<LeaderInfo> info = ParseLeaderValue(LeaderValue(1, "127.0.0.1:7001"), 42, 2);
  ASSERT_OK(info);
  EXPECT_EQ(*info, (LeaderInfo{42, 1, "127.0.0.1:7001"}));
  // The report's value: rank 2^31 - 1 in a fleet of 2.
  EXPECT_THAT(ParseLeaderValue("2147483647 127.0.0.1:7000", 42, 2),
              StatusIs(kInvalid, HasSubstr("rank 2147483647 is outside this fleet of 2 ranks")));
  EXPECT_THAT(ParseLeaderValue("2 127.0.0.1:7000", 42, 2), StatusIs(kInvalid, HasSubstr("outside this fleet")));
  EXPECT_THAT(ParseLeaderValue("0 127.0.0.1:7000", 42, 0), StatusIs(kInvalid, HasSubstr("outside this fleet")));
  for (const char* rank : {"-1 h:1", "+1 h:1", "01 h:1", "2147483648 h:1", "99999999999999999999999 h:1",
                           "x h:1", " h:1"}) {
    EXPECT_THAT(ParseLeaderValue(rank, 42, 2), StatusIs(kInvalid, HasSubstr("its rank is not a decimal"))) << rank;
  }
  EXPECT_THAT(ParseLeaderValue("1", 42, 2), StatusIs(kInvalid, HasSubstr("no space")));
  EXPECT_THAT(ParseLeaderValue("", 42, 2), StatusIs(kInvalid, HasSubstr("no space")));
  EXPECT_THAT(ParseLeaderValue("1 ", 42, 2), StatusIs(kInvalid, HasSubstr("HOST:PORT")));
  EXPECT_THAT(ParseLeaderValue("1 h:1 x", 42, 2), StatusIs(kInvalid, HasSubstr("port")));
  EXPECT_THAT(ParseLeaderValue("1 h x:1", 42, 2), StatusIs(kInvalid, HasSubstr("host")));
  EXPECT_THAT(ParseLeaderValue("1 unix:/run/x", 42, 2), StatusIs(kInvalid, HasSubstr("port")));
  // What the message repeats of the value is bounded and escaped.
  const absl::Status long_value = ParseLeaderValue(std::string(10000, '\x01'), 42, 2).status();
  EXPECT_LT(long_value.message().size(), 1000u);
  EXPECT_THAT(long_value.message(), HasSubstr("\\x01"));
}

etcd::KeyValue Kv(const std::string& key, const std::string& value, int64_t lease, int64_t revision = 7) {
  etcd::KeyValue kv;
  kv.key = key;
  kv.value = value;
  kv.create_revision = revision;
  kv.mod_revision = revision;
  kv.lease = lease;
  return kv;
}

TEST(ParseLeaderKeyTest, AKeyOnNoLeaseLeadsNobody) {
  absl::StatusOr<LeaderInfo> info = ParseLeaderKey(Kv("/f/coordinator/1", "0 127.0.0.1:1", 0x51), 2);
  ASSERT_OK(info);
  EXPECT_EQ(info->term, 7);
  EXPECT_EQ(info->rank, 0);
  EXPECT_THAT(ParseLeaderKey(Kv("/f/coordinator/1", "0 127.0.0.1:1", 0), 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is on no lease")));
  EXPECT_THAT(ParseLeaderKey(Kv("/f/coordinator/1", "5 127.0.0.1:1", 0x51), 2),
              StatusIs(kInvalid, HasSubstr("outside this fleet")));
}

TEST(ParseMemberKeyTest, ALivenessKeyListsARankOfThisFleetOnALease) {
  const std::string members = "/f/members/";
  absl::StatusOr<ListedMember> member = ParseMemberKey(Kv("/f/members/1", MemberValue(9, "[::1]:7001"), 3), members, 2);
  ASSERT_OK(member);
  EXPECT_EQ(member->rank, 1);
  EXPECT_EQ(member->incarnation, 9u);
  EXPECT_EQ(member->address, "[::1]:7001");
  EXPECT_OK(ParseMemberKey(Kv("/f/members/0", "18446744073709551615 h:1", 3), members, 2));
  for (const char* key : {"/f/members/2", "/f/members/2147483647", "/f/members/-1", "/f/members/01", "/f/members/",
                          "/f/members/1/x", "/f/other/1", "/f/members/99999999999999999999"}) {
    EXPECT_THAT(ParseMemberKey(Kv(key, "9 h:1", 3), members, 2),
                StatusIs(kInvalid, HasSubstr("is not the liveness key of a rank of this fleet of 2 ranks")))
        << key;
  }
  for (const char* value : {"0 h:1", "-9 h:1", "x h:1", "18446744073709551616 h:1"}) {
    EXPECT_THAT(ParseMemberKey(Kv("/f/members/1", value, 3), members, 2),
                StatusIs(kInvalid, HasSubstr("incarnation is not a non-zero decimal")))
        << value;
  }
  EXPECT_THAT(ParseMemberKey(Kv("/f/members/1", "9", 3), members, 2), StatusIs(kInvalid, HasSubstr("no space")));
  EXPECT_THAT(ParseMemberKey(Kv("/f/members/1", "9 nowhere", 3), members, 2), StatusIs(kInvalid, HasSubstr("PORT")));
  EXPECT_THAT(ParseMemberKey(Kv("/f/members/1", "9 h:1", 0), members, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("on no lease")));
}

TEST(EtcdRefusalsTest, AValueIsNewOnceThenLoggedAgainOncePerInterval) {
  EtcdRefusals refusals(absl::Minutes(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const etcd::KeyValue kv = Kv("/f/coordinator/1", "x", 0, 7);
  EXPECT_EQ(refusals.Refuse(kv, t0), EtcdRefusals::Seen::kNew);
  EXPECT_EQ(refusals.Refuse(kv, t0 + absl::Seconds(59)), EtcdRefusals::Seen::kQuiet);
  EXPECT_EQ(refusals.Refuse(kv, t0 + absl::Seconds(60)), EtcdRefusals::Seen::kAgain);
  EXPECT_EQ(refusals.Refuse(kv, t0 + absl::Seconds(61)), EtcdRefusals::Seen::kQuiet);
  // Written again (another mod revision): a new value, counted again.
  EXPECT_EQ(refusals.Refuse(Kv("/f/coordinator/1", "y", 0, 8), t0 + absl::Seconds(62)), EtcdRefusals::Seen::kNew);
  EXPECT_EQ(refusals.Refuse(Kv("/f/coordinator/2", "y", 0, 9), t0), EtcdRefusals::Seen::kNew);
  EXPECT_EQ(refusals.size(), 2u);
  refusals.Retain({"/f/coordinator/2"});
  EXPECT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals.Refuse(Kv("/f/coordinator/1", "y", 0, 8), t0), EtcdRefusals::Seen::kNew) << "forgotten";
}

}  // namespace
}  // namespace orthoserve
