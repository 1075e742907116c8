// Which fleet ranks a certificate's names are (server/fleet/logic/fleet_identity.h): exact DNS names
// per rank, wildcard DNS names over one leftmost label, a fleet-wide name without {rank}, names
// of no member (URI SANs among them), and the patterns that are refused.
#include "server/fleet/logic/fleet_identity.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::IsOkAndHolds;
using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

CertificateNames Dns(std::vector<std::string> names) { return CertificateNames{std::move(names), {}}; }
CertificateNames Uri(std::vector<std::string> names) { return CertificateNames{{}, std::move(names)}; }

FleetMemberNames Names(absl::string_view pattern, int world) {
  absl::StatusOr<FleetMemberNames> names = FleetMemberNames::Create(pattern, world);
  EXPECT_OK(names.status());
  return *std::move(names);
}

TEST(FleetIdentityTest, EachRankHasItsOwnNameAndACertificateNamesOnlyTheRanksItCarries) {
  const FleetMemberNames names = Names(kDefaultFleetMemberName, 4);
  EXPECT_TRUE(names.per_rank());
  EXPECT_THAT(names.NameOf(0), IsOkAndHolds("orthoserve-rank-0"));
  EXPECT_THAT(names.NameOf(3), IsOkAndHolds("orthoserve-rank-3"));
  // A rank from etcd or from another rank's message may be anything: never an index unchecked.
  for (int rank : {-1, 4, 2147483647, -2147483647 - 1}) {
    EXPECT_THAT(names.NameOf(rank), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("outside this fleet of 4 ranks")))
        << rank;
  }
  EXPECT_THAT(names.RanksNamed(Dns({"orthoserve-rank-2"})), ElementsAre(2));
  EXPECT_TRUE(names.Names(Dns({"orthoserve-rank-2"}), 2));
  EXPECT_FALSE(names.Names(Dns({"orthoserve-rank-2"}), 1));
  // DNS names compare case-insensitively, a trailing dot ignored; several SANs name several ranks.
  EXPECT_THAT(names.RanksNamed(Dns({"ORTHOSERVE-Rank-1.", "orthoserve-rank-3", "localhost", "orthoserve-rank-1"})),
              ElementsAre(1, 3));
  // Ranks out of the fleet, near misses and other types of name are no member.
  EXPECT_THAT(names.RanksNamed(Dns({"orthoserve-rank-4", "orthoserve-rank-", "orthoserve-rank-01", "xorthoserve-rank-1",
                                    "orthoserve-rank-1.example", ""})),
              IsEmpty());
  EXPECT_THAT(names.RanksNamed(Uri({"orthoserve-rank-1"})), IsEmpty());  // A DNS name is no URI.
  EXPECT_THAT(names.RanksNamed(CertificateNames{}), IsEmpty());
  EXPECT_FALSE(names.NamesAnyMember(Dns({"localhost", "orthoserve-rank-9"})));
  EXPECT_TRUE(names.NamesAnyMember(Dns({"localhost", "orthoserve-rank-0"})));
  EXPECT_FALSE(names.Names(Dns({"orthoserve-rank-1"}), -1));
  EXPECT_FALSE(names.Names(Dns({"orthoserve-rank-1"}), 4));
}

TEST(FleetIdentityTest, AWildcardCoversExactlyOneLeftmostLabel) {
  const FleetMemberNames names = Names("orthoserve-{rank}.orthoserve-fleet.ml.svc", 3);
  EXPECT_THAT(names.RanksNamed(Dns({"*.orthoserve-fleet.ml.svc"})), ElementsAre(0, 1, 2));
  EXPECT_THAT(names.RanksNamed(Dns({"*.ORTHOSERVE-FLEET.ml.svc."})), ElementsAre(0, 1, 2));
  EXPECT_TRUE(names.Names(Dns({"*.orthoserve-fleet.ml.svc"}), 1));
  // Not two labels, not a parent of another namespace, not a partial or bare wildcard, not the
  // wildcard's own domain.
  EXPECT_THAT(names.RanksNamed(Dns({"*.ml.svc", "*.svc", "*.orthoserve-fleet.other.svc",
                                    "orthoserve-*.orthoserve-fleet.ml.svc", "*", "*.", "orthoserve-fleet.ml.svc"})),
              IsEmpty());
  // A wildcard over a single-label parent covers nothing, even when the names sit under it.
  const FleetMemberNames short_names = Names("rank-{rank}.fleet", 2);
  EXPECT_THAT(short_names.RanksNamed(Dns({"*.fleet"})), IsEmpty());
  EXPECT_THAT(short_names.RanksNamed(Dns({"rank-1.fleet"})), ElementsAre(1));
  // Names without a dot (the local default) are only ever matched exactly.
  const FleetMemberNames local = Names(kDefaultFleetMemberName, 2);
  EXPECT_THAT(local.RanksNamed(Dns({"*.orthoserve-rank-1", "*"})), IsEmpty());
}

TEST(FleetIdentityTest, APatternWithoutRankIsOneNameForEveryRank) {
  const FleetMemberNames names = Names("orthoserve-fleet.ml.svc", 3);
  EXPECT_FALSE(names.per_rank());
  for (int r = 0; r < 3; ++r) EXPECT_THAT(names.NameOf(r), IsOkAndHolds("orthoserve-fleet.ml.svc"));
  EXPECT_THAT(names.NameOf(3), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no member name")));
  // Any certificate that carries the fleet-wide name may claim any rank.
  EXPECT_THAT(names.RanksNamed(Dns({"orthoserve-fleet.ml.svc"})), ElementsAre(0, 1, 2));
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(names.Names(Dns({"orthoserve-fleet.ml.svc"}), r));
  EXPECT_THAT(names.RanksNamed(Dns({"other.ml.svc"})), IsEmpty());
}

TEST(FleetIdentityTest, BadPatternsAreRefusedNamingTheFlag) {
  for (absl::string_view bad : {"", "orthoserve rank {rank}", "*.orthoserve-fleet.ml.svc", "rank-{rank}\n",
                                "spiffe://cluster.local/ns/ml/orthoserve/{rank}", "orthoserve-{r}", "rank-{rank}}"}) {
    EXPECT_THAT(FleetMemberNames::Create(bad, 2).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fleet-tls-member-name")))
        << bad;
  }
  EXPECT_THAT(FleetMemberNames::Create(kDefaultFleetMemberName, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--world")));
}

TEST(FleetIdentityTest, RanksAreDescribedForRefusals) {
  EXPECT_EQ(DescribeRanks({}), "no fleet member");
  EXPECT_EQ(DescribeRanks({2}), "rank 2");
  EXPECT_EQ(DescribeRanks({0, 2}), "ranks 0 and 2");
  EXPECT_EQ(DescribeRanks({0, 1, 2, 3}), "ranks 0 to 3");
  EXPECT_EQ(DescribeRanks({1, 3, 5}), "ranks 1, 3 and 5");
  EXPECT_EQ(DescribeRanks({1, 3, 5, 7, 9, 11, 13, 15, 17, 19}), "ranks 1, 3, 5, 7, 9, 11, 13, 15 and 2 more");
}

}  // namespace
}  // namespace orthoserve
