// A partial partition with the real binaries: two members of the fleet cannot open connections
// to each other while both still reach the coordinator, etcd and the clients. Runs in a network
// namespace of its own (run_in_netns.sh; skipped where the test cannot make one), where each rank
// listens on its own loopback address (127.0.0.10-12) and runs under a uid of its own, so that
// policy-routing rules (`ip rule ... uidrange U to HOST prohibit`) refuse exactly the connections
// of one rank to the other: its collective (Gloo) port, its fleet port and its public port.
//
// The fleet (3 ranks, an elected coordinator, a one-member etcd) serves the W = 4 trainer group
// and the lone client of elastic_test.cc. The two members are cut apart and one of them is
// restarted: the generation that takes it back cannot form (their Gloo pair is refused), the
// coordinator quarantines one end after --fleet-quarantine-after failed formations, and the other
// two ranks form a working generation. No step may fail or differ from the fault-free run, the
// group may stall at most the peer timeout + 3 s, and once the partition heals the quarantined
// rank is taken back when its quarantine ends.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/fleet/elastic_harness.h"
#include "tests/unit/etcd/etcd_process.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using namespace elastic;  // NOLINT: the harness is this test's vocabulary.

// Rank r runs as uid/gid kUid + r.
constexpr int kUid = 20000;
// Longer than one stretch of failed formations (--fleet-quarantine-after = 3 of them, each up to
// the peer timeout), so that a fleet that quarantines one end serves as two most of the window.
constexpr absl::Duration kQuarantine = absl::Seconds(6);
// How long the cut is sampled once the coordinator first serves as two.
constexpr absl::Duration kCutWindow = absl::Seconds(8);
// The failed formations before the first quarantine: 3 of up to kPeer each, with room for a
// loaded machine.
constexpr absl::Duration kFirstQuarantineBy = absl::Seconds(30);

// Runs `command` (sh), failing the test when it does not exit 0.
void Shell(const std::string& command) {
  const int rc = std::system(command.c_str());
  ASSERT_EQ(rc, 0) << command;
}

// Refuses (or, with `add` false, allows again) every connection rank a opens to rank b's address
// and rank b opens to rank a's.
void Cut(const Fleet& fleet, int a, int b, bool add) {
  const char* verb = add ? "add" : "del";
  for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    Shell(absl::StrCat("ip rule ", verb, " pref ", 10 + from, " uidrange ", kUid + from, "-", kUid + from, " to ",
                       fleet.Host(to), " prohibit"));
  }
}

// The coordinating rank as an answering rank sees it (-1: none).
int CoordinatorOf(Fleet& fleet) {
  for (int r = 0; r < kFleet; ++r) {
    absl::StatusOr<v1::ServerInfo> info = fleet.Info(r);
    if (info.ok() && info->coordinator().term() > 0) return info->coordinator().rank();
  }
  return -1;
}

TEST(PartitionTest, TwoMembersThatCannotReachEachOtherLeaveAWorkingGenerationOfTwo) {
  if (std::getenv("ORTHOSERVE_TEST_NETNS") == nullptr) {
    GTEST_SKIP() << "needs a network namespace of its own (run through tests/integration/fleet/run_in_netns.sh)";
  }
  // The local routing table moves behind the rules this test adds (rule 0 would match first).
  Shell("ip rule add pref 100 lookup local && ip rule del pref 0");

  absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> etcd = testing::EtcdCluster::Start(1);
  ASSERT_OK(etcd);
  const std::string membership = absl::StrCat("etcd://", (*etcd)->endpoints(), "/orthoserve/partition-", getpid());
  Fleet fleet(kFleet, "partition", membership,
              {"--fleet-leader-ttl", "2s", "--fleet-quarantine-base", absl::StrCat(absl::ToInt64Seconds(kQuarantine), "s")});
  fleet.DistinctHosts();
  fleet.Wrap([](int r) {
    const std::string id = std::to_string(kUid + r);
    return std::vector<std::string>{"/usr/bin/setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups", "--"};
  });
  fleet.StartAll();
  ASSERT_NE(fleet.WaitWhole(absl::Seconds(60)), absl::InfiniteDuration()) << "the fleet did not form";

  GroupClient::Options go;
  go.client = WorkloadClient(fleet.Addresses());
  auto group = GroupClient::Create(go);
  ASSERT_OK(group);
  auto lone = Client::Create(WorkloadClient(fleet.Addresses()));
  ASSERT_OK(lone);
  Workload work(group->get(), lone->get());
  work.Start();
  ASSERT_TRUE(work.Progress(kVariants + 2, absl::Seconds(60))) << "no progress before the fault";

  // Cut the two members apart (not the coordinator: that would be a coordinator loss for one of
  // them), then restart one of them: its new incarnation must join a generation with the other.
  const int c = CoordinatorOf(fleet);
  ASSERT_GE(c, 0);
  const int a = (c + 1) % kFleet, b = (c + 2) % kFleet;
  const absl::Time start = absl::Now();
  Cut(fleet, a, b, /*add=*/true);
  fleet.rank(b).Signal(SIGKILL);
  ASSERT_TRUE(fleet.rank(b).Wait(absl::Seconds(5)).ok());
  fleet.Start(b);

  // Once the restarted rank answers, the generation that would take it back cannot form (its
  // Gloo pair with the other end is refused): after a few failed formations the coordinator
  // quarantines one end, and the coordinator and the other end serve the group as two.
  const absl::Time restarted_by = absl::Now() + absl::Seconds(20);
  while (absl::Now() < restarted_by && !fleet.Info(b).ok()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(fleet.Info(b).ok()) << "the restarted rank " << b << " does not answer";
  // After a few failed formations the coordinator quarantines one end and serves as two.
  const absl::Time answered = absl::Now();
  while (absl::Now() < answered + kFirstQuarantineBy && fleet.ReadyMembers(c) != 2) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const absl::Duration first_two = absl::Now() - answered;
  ASSERT_EQ(fleet.ReadyMembers(c), 2) << "the coordinator did not quarantine an end of the cut within "
                                      << FormatSeconds(kFirstQuarantineBy);
  // Sampled through the window from then: the quarantine is released (and fails to form again)
  // now and then, so the fleet serves as two most of the time, not all of it.
  int samples = 0, as_two = 0;
  for (const absl::Time end = absl::Now() + kCutWindow; absl::Now() < end; ++samples) {
    as_two += fleet.ReadyMembers(c) == 2 ? 1 : 0;
    absl::SleepFor(absl::Milliseconds(100));
  }
  const bool both_alive = fleet.Info(a).ok() && fleet.Info(b).ok();
  ASSERT_TRUE(work.Progress(5, absl::Seconds(30))) << "no progress while the members were cut apart";
  const absl::Duration cut_stall = work.LongestStall(start, absl::Now(), /*group=*/true);
  const absl::Duration cut_lone = work.LongestStall(start, absl::Now(), /*group=*/false);
  EXPECT_GE(as_two * 2, samples) << "the coordinator should serve with one end of the cut most of the time ("
                                      << as_two << " of " << samples << " samples)";
  EXPECT_TRUE(both_alive);

  // Heal: the quarantined end is taken back when its quarantine is over.
  const absl::Time healed = absl::Now();
  Cut(fleet, a, b, /*add=*/false);
  const absl::Duration whole = fleet.WaitWhole(absl::Seconds(60));
  ASSERT_TRUE(work.Progress(3, absl::Seconds(30))) << "no progress after the partition healed";
  const absl::Duration heal_stall = work.LongestStall(healed, absl::Now(), /*group=*/true);
  work.Stop();

  std::cout << "\n| phase | fleet | longest group stall | longest lone stall |\n|---|---|---|---|\n"
            << "| ranks " << a << " and " << b << " cut apart, rank " << b << " restarted | 2 of 3 ready after " << FormatSeconds(first_two) << ", then in "
            << as_two << " of " << samples << " samples over " << FormatSeconds(kCutWindow) << " | " << FormatSeconds(cut_stall) << " | " << FormatSeconds(cut_lone) << " |\n"
            << "| healed | whole after " << FormatSeconds(whole) << " | " << FormatSeconds(heal_stall) << " | |\n"
            << std::endl;
  EXPECT_LE(cut_stall, kPeer + kStallMargin) << "the group waited for a generation that could not form";
  EXPECT_LE(cut_lone, kPeer + kStallMargin);
  EXPECT_NE(whole, absl::InfiniteDuration()) << "the quarantined rank was not taken back";
  EXPECT_LE(heal_stall, kPeer + kStallMargin);
  ExpectCleanRun(work);
  ExpectEveryRankExitsOnSigterm(fleet, kFleet);
}

}  // namespace
}  // namespace orthoserve
