// The elastic fleet under faults, with the real binaries on loopback: a 3-rank CPU fleet
// serves a W = 4 trainer group and a lone client stepping continuously (default client
// settings: retries on) while ranks are killed and restarted (a member, then the coordinator),
// restarted one by one with SIGTERM (a rolling update), and stopped for longer than the peer
// timeout. No step may fail, every result must be bit-identical to the fault-free run, the
// fleet must be back to 3 members within a bound, and every rank must exit on SIGTERM within
// the drain timeout. Also: SIGTERM ends a rank promptly while its coordinator is gone and a
// group step waits on it. Prints the measured recovery figures (time to detect, to re-form,
// steps retried) as a table, also written to $ORTHOSERVE_ELASTIC_REPORT when set.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/client.h"
#include "client/cpp/group_client.h"
#include "common/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/binaries/subprocess.h"
#include "tests/integration/fleet/elastic_harness.h"
#include "tests/integration/fleet/fleet_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using namespace elastic;  // NOLINT: the harness is this test's vocabulary.

TEST(ElasticFleetTest, TrainersRideThroughKillsRestartsRollingUpdatesAndStops) {
  Fleet fleet(kFleet, "elastic");
  fleet.StartAll();
  ASSERT_NE(fleet.WaitWhole(absl::Seconds(60)), absl::InfiniteDuration()) << "the fleet did not form";

  GroupClient::Options go;
  go.client = WorkloadClient({fleet.Address(0)});
  auto group = GroupClient::Create(go);
  ASSERT_OK(group);
  auto lone = Client::Create(WorkloadClient({fleet.Address(1)}));
  ASSERT_OK(lone);

  Workload work(group->get(), lone->get());
  work.Start();
  ASSERT_TRUE(work.Progress(kVariants + 2, absl::Seconds(60))) << "no progress before the faults";

  // Times are from the start of the fault; "whole again" is when every rank reports a formed
  // generation of all three.
  std::string table =
      "| fault | rank gone after | fleet whole again after | group steps retried | lone steps retried | "
      "longest group stall | longest lone stall |\n"
      "|---|---|---|---|---|---|---|\n";
  // Returns the longest group stall.
  auto row = [&](const std::string& fault, const std::string& gone, absl::Time start, int64_t g0, int64_t l0) {
    const absl::Duration whole = fleet.WaitWhole(absl::Seconds(60));
    const absl::Duration since = whole == absl::InfiniteDuration() ? whole : absl::Now() - start;
    EXPECT_LE(since, kReformBound) << fault;
    EXPECT_TRUE(work.Progress(3, absl::Seconds(60))) << "no progress after " << fault;
    const absl::Duration group_stall = work.LongestStall(start, absl::Now(), /*group=*/true);
    const absl::Duration lone_stall = work.LongestStall(start, absl::Now(), /*group=*/false);
    absl::StrAppend(&table, "| ", fault, " | ", gone, " | ", FormatSeconds(since), " | ", (*group)->retries() - g0,
                    " | ", (*lone)->retries() - l0, " | ", FormatSeconds(group_stall), " | ", FormatSeconds(lone_stall),
                    " |\n");
    return std::make_pair(group_stall, lone_stall);
  };

  for (int r : {2, 0}) {  // SIGKILL of a member, then of the coordinator, restarted after 0.5 s.
    const int64_t g0 = (*group)->retries(), l0 = (*lone)->retries();
    const absl::Time start = absl::Now();
    fleet.rank(r).Signal(SIGKILL);
    absl::SleepFor(kRestartDelay);
    fleet.Start(r);
    row(absl::StrCat("SIGKILL rank ", r, r == 0 ? " (the coordinator)" : "", ", restart after 0.5 s"), "at once",
        start, g0, l0);
  }
  for (int r = 0; r < kFleet; ++r) {  // Rolling update: SIGTERM, wait for the exit, start again.
    const int64_t g0 = (*group)->retries(), l0 = (*lone)->retries();
    const absl::Time start = absl::Now();
    fleet.rank(r).Signal(SIGTERM);
    absl::StatusOr<int> code = fleet.rank(r).Wait(kDrain + kExitMargin);
    ASSERT_TRUE(code.ok()) << code.status() << "rank " << r << " did not exit on SIGTERM";
    EXPECT_EQ(*code, 0);
    const absl::Duration exited = absl::Now() - start;
    fleet.Start(r);
    row(absl::StrCat("SIGTERM rank ", r, " (rolling update), restart at its exit"),
        absl::StrCat("exited in ", FormatSeconds(exited)), start, g0, l0);
  }
  {  // SIGSTOP of a member for well over the peer timeout: the trainers and the lone client must
     // go on after about the peer timeout, not when it resumes.
    const int64_t g0 = (*group)->retries(), l0 = (*lone)->retries();
    const absl::Time start = absl::Now();
    fleet.rank(2).Signal(SIGSTOP);
    const absl::Duration detect = fleet.WaitDropped(0, kPeer + absl::Seconds(10));
    EXPECT_LE(detect, kPeer + absl::Seconds(3));
    const absl::Duration stopped = kPeer + absl::Seconds(6);
    absl::SleepFor(std::max(absl::ZeroDuration(), stopped - (absl::Now() - start)));
    // While it is still stopped, both have moved on.
    const absl::Duration group_then = work.LongestStall(start, absl::Now(), /*group=*/true);
    const absl::Duration lone_then = work.LongestStall(start, absl::Now(), /*group=*/false);
    fleet.rank(2).Signal(SIGCONT);
    const auto [group_stall, lone_stall] =
        row("SIGSTOP rank 2 for the peer timeout (2 s) + 6 s, then SIGCONT",
            absl::StrCat("dropped after ", FormatSeconds(detect)), start, g0, l0);
    EXPECT_LE(group_then, kPeer + kStallMargin) << "the group waited for the stopped rank";
    EXPECT_LE(lone_then, kPeer + kStallMargin) << "the lone client waited for the stopped rank";
    EXPECT_LE(group_stall, kPeer + kStallMargin);
    EXPECT_LE(lone_stall, kPeer + kStallMargin);
  }

  work.Stop();
  std::cout << "\n" << table << std::endl;
  if (const char* path = std::getenv("ORTHOSERVE_ELASTIC_REPORT"); path != nullptr) std::ofstream(path) << table;
  ExpectCleanRun(work);
  ExpectEveryRankExitsOnSigterm(fleet, kFleet);
}

TEST(ElasticFleetTest, SigtermEndsARankPromptlyWhileItsCoordinatorIsGone) {
  Fleet fleet(2, "elastic-term");
  fleet.StartAll();
  ASSERT_NE(fleet.WaitWhole(absl::Seconds(60)), absl::InfiniteDuration());
  // Trainer rank 0 of 2 streams to rank 1 and waits for a partner that never comes.
  ClientOptions o;
  o.address = fleet.Address(1);
  o.timeout = absl::Seconds(120);
  o.retry.enabled = false;
  auto c = Client::Create(o);
  ASSERT_OK(c);
  TrainerInputs t = MakeInputs(0, 0, /*world=*/2);
  auto call = std::async(std::launch::async, [&] {
    return (*c)->Step(client::StepOptions{"term", "g", 1, 0, 2, "run"}, t.inputs);
  });
  absl::SleepFor(absl::Milliseconds(500));
  fleet.rank(0).Signal(SIGKILL);
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Time start = absl::Now();
  fleet.rank(1).Signal(SIGTERM);
  absl::StatusOr<int> code = fleet.rank(1).Wait(kDrain + kExitMargin);
  ASSERT_TRUE(code.ok()) << code.status() << "rank 1 did not exit within the drain timeout + " << kExitMargin;
  EXPECT_EQ(*code, 0);
  EXPECT_LE(absl::Now() - start, kDrain + kExitMargin);
  ASSERT_EQ(call.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::StatusOr<std::vector<MatrixOutput>> out = call.get();
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace orthoserve
