// What a member checks in another rank's messages before anything is indexed by a rank from them
// (server/fleet/wire/entry_checks.h, fleet_codec.h): a log entry whose per-trainer-rank lists
// disagree with its trainer world becomes the failure of its step, and a report's trainer world
// is bounded. Pure, no network.
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/fleet/wire/entry_checks.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/rpc/service_state.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

static_assert(kMaxFleetTrainerWorld == kMaxGroupWorld,
              "a member bounds reports by the largest world the public ingress takes");

// A batch of `world` trainer ranks, two matrices, one placement per rank each.
LogEntry Batch(int world) {
  LogEntry e;
  e.index = 12;
  e.generation = 3;
  e.key.step = 5;
  e.plan.trainer_world = world;
  e.plan.fleet_world = 2;
  for (int m = 0; m < 2; ++m) {
    MatrixPlan plan;
    plan.name = m == 0 ? "w0" : "w1";
    for (int t = 0; t < world; ++t) plan.blocks.push_back(BlockPlacement{t, t % 2, Block{}});
    e.plan.matrices.push_back(plan);
  }
  e.submissions.assign(world, 1);
  e.digests.assign(world, 2);
  return e;
}

TEST(CheckBatchShapeTest, EveryPerRankListAgreesWithTheTrainerWorld) {
  EXPECT_OK(CheckBatchShape(Batch(4)));
  LogEntry no_digests = Batch(4);
  no_digests.digests.clear();
  EXPECT_OK(CheckBatchShape(no_digests));
  LogEntry failure;
  failure.status = absl::AbortedError("x");
  EXPECT_TRUE(CheckBatchShape(failure).ok()) << "a failure entry indexes nothing";

  LogEntry e = Batch(4);
  e.plan.trainer_world = 2147483647;
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("trainer world 2147483647 is not 1 to 65536")));
  e = Batch(4);
  e.plan.trainer_world = 0;
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("trainer world 0")));
  e = Batch(4);
  e.plan.fleet_world = 0;
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("fleet world 0")));
  e = Batch(4);
  e.submissions.pop_back();
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("3 submissions for 4 trainer ranks")));
  e = Batch(4);
  e.digests.push_back(0);
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("5 digests for 4 trainer ranks")));
  e = Batch(4);
  e.cached.assign(2, true);
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("2 cached flags for 4 trainer ranks")));
  e = Batch(4);
  e.plan.matrices[1].blocks.pop_back();
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("has 3 placements for 4 trainer ranks")));
  e = Batch(4);
  e.part_offset = -1;
  EXPECT_THAT(CheckBatchShape(e), StatusIs(kInvalid, HasSubstr("part offset -1")));
}

TEST(CheckBatchShapeTest, AnUnusableBatchIsItsStepsFailure) {
  const LogEntry e = Batch(4);
  const LogEntry failure = UnusableBatch(e, absl::InvalidArgumentError("3 submissions for 4 trainer ranks"));
  EXPECT_EQ(failure.index, e.index);
  EXPECT_EQ(failure.generation, e.generation);
  EXPECT_EQ(failure.key, e.key);
  EXPECT_THAT(failure.status, StatusIs(absl::StatusCode::kInternal, HasSubstr("cannot be run here: 3 submissions")));
  EXPECT_EQ(failure.failure, kStepFailureInvalid);
  EXPECT_TRUE(failure.plan.matrices.empty());
  EXPECT_TRUE(failure.submissions.empty());
  EXPECT_OK(CheckBatchShape(failure));
}

TEST(ReadyReportFromProtoTest, ATrainerWorldOverTheLimitIsRefused) {
  fleet::v1::ReadyReport p;
  p.set_trainer_world(kMaxFleetTrainerWorld + 1);
  EXPECT_THAT(ReadyReportFromProto(p), StatusIs(kInvalid, HasSubstr("over the fleet's limit of 65536")));
  p.set_trainer_world(2147483647);
  EXPECT_THAT(ReadyReportFromProto(p), StatusIs(kInvalid, HasSubstr("trainer world 2147483647")));
}

}  // namespace
}  // namespace orthoserve
