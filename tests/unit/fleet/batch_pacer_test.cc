// BatchPacer on its own (server/fleet/logic/batch_pacer.h), without a coordinator, a log or a
// network: the window of appended batches not yet run, the fair order of queued steps, stale and
// repeated keys, stalled batches, and how a step is cut into parts that cover its matrices in
// order, each at least one matrix per member and growing with the measured rate.
#include "server/fleet/logic/batch_pacer.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoserve {
namespace {

using ::testing::ElementsAre;

MatrixPlan Plan(int64_t n) {
  MatrixPlan m;
  m.name = "w" + std::to_string(n);
  m.shape = {n, n};
  m.view = Matrix2d{n, n};
  return m;
}

std::vector<MatrixPlan> Plans(int count, int64_t n = 64) { return std::vector<MatrixPlan>(count, Plan(n)); }

GroupKey Key(const std::string& tenant, int64_t step) { return GroupKey{tenant, "j", "g", step, "run"}; }

// The whole batch of `key` over `specs`, planned for `generation` on `fleet` members.
LogEntry Batch(const GroupKey& key, std::vector<MatrixPlan> specs, int fleet, int64_t generation = 1) {
  LogEntry entry;
  entry.key = key;
  entry.generation = generation;
  entry.plan.trainer_world = 1;
  entry.plan.fleet_world = fleet;
  entry.plan.matrices = std::move(specs);
  for (MatrixPlan& m : entry.plan.matrices) m.blocks = {BlockPlacement{0, 0, Block{0, 0, m.view.rows, m.view.cols}}};
  entry.submissions = {1};
  entry.digests = {2};
  return entry;
}

// Options that pace (a window of 4) and cut steps into parts of `part_time` of work.
BatchPacer::Options PartOptions(absl::Duration part_time = absl::Milliseconds(10)) {
  BatchPacer::Options o;
  o.batch_window = 4;
  o.part_time = part_time;
  return o;
}

// Rank 0 ran one batch of estimated `cost` in `took`: the rate parts are sized by.
void MeasureRate(BatchPacer& pacer, double cost, absl::Duration took) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  pacer.Appended(1, cost, t0);
  pacer.Ran(1, t0 + took);
}

TEST(BatchPacerTest, MatrixCostsAreEachMatrixsEstimateInOrder) {
  const std::vector<MatrixPlan> plans = {Plan(32), Plan(64), Plan(128)};
  const std::vector<double> costs = MatrixCosts(plans);
  ASSERT_EQ(costs.size(), 3u);
  for (size_t i = 0; i < plans.size(); ++i) EXPECT_EQ(costs[i], EstimatedCost(plans[i]));
  EXPECT_LT(costs[0], costs[1]);
  EXPECT_LT(costs[1], costs[2]);
}

TEST(BatchPacerTest, WithoutPacingEveryQueuedStepIsHandedOutWholeOnce) {
  BatchPacer pacer(BatchPacer::Options{});
  EXPECT_FALSE(pacer.Pacing(true));
  ASSERT_TRUE(pacer.Queue(Key("a", 1), Plans(3), /*replay=*/false, 2));
  EXPECT_FALSE(pacer.Queue(Key("a", 1), Plans(3), false, 2)) << "queued twice";
  ASSERT_TRUE(pacer.Queue(Key("b", 1), Plans(2), false, 2));
  EXPECT_EQ(pacer.queued(), 2u);
  std::vector<std::string> order;
  while (std::optional<BatchPacer::Turn> turn = pacer.Next(/*pacing=*/false)) {
    EXPECT_FALSE(turn->part);
    EXPECT_EQ(turn->part_end, turn->costs.size()) << "no part_time: whole";
    order.push_back(turn->key.tenant);
  }
  // In fair order (common/fair_queue.h): each step's tag is its cost, so b's two matrices go
  // before a's three although a was queued first.
  EXPECT_THAT(order, ElementsAre("b", "a"));
  EXPECT_TRUE(pacer.Queue(Key("a", 1), Plans(3), false, 2)) << "handed out: it may be queued again (a retry)";
}

TEST(BatchPacerTest, AStepThatLostAReportIsSkippedUntilQueuedAgain) {
  BatchPacer pacer(BatchPacer::Options{});
  ASSERT_TRUE(pacer.Queue(Key("a", 1), Plans(1), false, 1));
  ASSERT_TRUE(pacer.Queue(Key("a", 2), Plans(1), false, 1));
  pacer.Unqueue(Key("a", 1));
  std::optional<BatchPacer::Turn> turn = pacer.Next(false);
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(turn->key.step, 2);
  EXPECT_FALSE(pacer.Next(false).has_value());
  ASSERT_TRUE(pacer.Queue(Key("a", 1), Plans(1), false, 1));  // Complete again.
  turn = pacer.Next(false);
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(turn->key.step, 1);
}

TEST(BatchPacerTest, TheWindowHoldsTurnsBackUntilRankZeroRanTheAppendedBatches) {
  BatchPacer::Options o;
  o.batch_window = 1;
  BatchPacer pacer(o);
  EXPECT_TRUE(pacer.Pacing(true));
  EXPECT_FALSE(pacer.Pacing(false)) << "only while rank 0 runs every batch";
  for (int64_t s = 1; s <= 3; ++s) ASSERT_TRUE(pacer.Queue(Key("a", s), Plans(1), false, 1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(pacer.Next(true).has_value());
  pacer.Appended(10, 1.0, t0);
  EXPECT_FALSE(pacer.Next(true).has_value()) << "the window of one is full";
  EXPECT_TRUE(pacer.Next(false).has_value()) << "not pacing: any";
  pacer.Appended(11, 1.0, t0);
  pacer.Ran(10, t0 + absl::Milliseconds(5));
  EXPECT_FALSE(pacer.Next(true).has_value()) << "batch 11 has not run";
  pacer.Ran(11, t0 + absl::Milliseconds(10));
  EXPECT_TRUE(pacer.Next(true).has_value());
}

TEST(BatchPacerTest, BatchesRankZeroNeverReportsStopHoldingTheQueueAfterTheTimeout) {
  BatchPacer::Options o;
  o.batch_window = 1;
  BatchPacer pacer(o);
  ASSERT_TRUE(pacer.Queue(Key("a", 1), Plans(1), false, 1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  pacer.Appended(5, 1.0, t0);
  EXPECT_FALSE(pacer.DropStalled(t0 + absl::Seconds(1), absl::Seconds(2)));
  EXPECT_FALSE(pacer.Next(true).has_value());
  EXPECT_TRUE(pacer.DropStalled(t0 + absl::Seconds(3), absl::Seconds(2)));
  EXPECT_TRUE(pacer.Next(true).has_value());
  // A new generation holds nothing back either.
  ASSERT_TRUE(pacer.Queue(Key("a", 2), Plans(1), false, 1));
  pacer.Appended(6, 1.0, t0);
  pacer.Reformed();
  EXPECT_TRUE(pacer.Next(true).has_value());
}

// With a rate measured (one batch of a known cost ran in a known time), a step is cut into parts
// of about part_time of work, at least one matrix per member; NextPart hands them out in order,
// covering every matrix once, each part a batch of its own with its offset and more_parts.
TEST(BatchPacerTest, AStepIsCutIntoPartsThatCoverItsMatricesInOrder) {
  BatchPacer pacer(PartOptions());
  const std::vector<MatrixPlan> plans = Plans(7);
  const double one = EstimatedCost(plans[0]);
  MeasureRate(pacer, 2.5 * one, absl::Milliseconds(10));  // part_time holds 2 matrices.

  const GroupKey key = Key("a", 1);
  ASSERT_TRUE(pacer.Queue(key, plans, false, /*members=*/1));
  std::optional<BatchPacer::Turn> turn = pacer.Next(true);
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(turn->part_end, 2u);
  pacer.Divide(Batch(key, plans, /*fleet=*/1), turn->part_end, turn->costs);
  EXPECT_TRUE(pacer.divided(key));

  std::vector<int64_t> offsets, sizes;
  std::vector<bool> more;
  for (int guard = 0; guard < 10; ++guard) {
    std::optional<BatchPacer::Part> part = pacer.NextPart(key, /*rest=*/false, /*pacing=*/true, /*generation=*/1);
    ASSERT_TRUE(part.has_value());
    offsets.push_back(part->entry.part_offset);
    sizes.push_back(static_cast<int64_t>(part->entry.plan.matrices.size()));
    more.push_back(part->entry.more_parts);
    EXPECT_DOUBLE_EQ(part->cost, one * static_cast<double>(part->entry.plan.matrices.size()));
    if (!part->entry.more_parts) break;
  }
  EXPECT_THAT(offsets, ElementsAre(0, 2, 4, 6));
  EXPECT_THAT(sizes, ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(more, ElementsAre(true, true, true, false));
  EXPECT_FALSE(pacer.divided(key));
  EXPECT_FALSE(pacer.NextPart(key, false, true, 1).has_value());
}

TEST(BatchPacerTest, TheRestGoesAtOnceWhenAskedOrInAnotherGeneration) {
  BatchPacer pacer(PartOptions());
  const std::vector<MatrixPlan> plans = Plans(6);
  MeasureRate(pacer, EstimatedCost(plans[0]), absl::Milliseconds(10));  // One matrix per part.
  for (const auto& [rest, generation] : {std::pair{true, int64_t{1}}, std::pair{false, int64_t{2}}}) {
    const GroupKey key = Key("a", generation + (rest ? 10 : 0));
    pacer.Divide(Batch(key, plans, /*fleet=*/2, /*generation=*/1), 2, MatrixCosts(plans));
    std::optional<BatchPacer::Part> first = pacer.NextPart(key, false, true, 1);
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->entry.plan.matrices.size(), 2u);
    std::optional<BatchPacer::Part> last = pacer.NextPart(key, rest, true, generation);
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(last->entry.part_offset, 2);
    EXPECT_EQ(last->entry.plan.matrices.size(), 4u);
    EXPECT_FALSE(last->entry.more_parts);
    EXPECT_EQ(last->entry.generation, 1) << "planned for its own generation's ranks";
    EXPECT_FALSE(pacer.divided(key));
  }
}

TEST(BatchPacerTest, AReplayAndAStepWithoutPartTimeGoWhole) {
  BatchPacer pacer(PartOptions());
  MeasureRate(pacer, EstimatedCost(Plan(64)), absl::Milliseconds(10));
  ASSERT_TRUE(pacer.Queue(Key("a", 1), Plans(5), /*replay=*/true, 1));
  std::optional<BatchPacer::Turn> turn = pacer.Next(true);
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(turn->part_end, 5u) << "a replay is not divided";

  BatchPacer whole(BatchPacer::Options{});
  ASSERT_TRUE(whole.Queue(Key("a", 1), Plans(5), false, 1));
  turn = whole.Next(false);
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(turn->part_end, 5u);
}

TEST(BatchPacerTest, APartHasAtLeastOneMatrixPerMember) {
  BatchPacer pacer(PartOptions(absl::Nanoseconds(1)));  // Almost no time: the floor decides.
  MeasureRate(pacer, 1.0, absl::Seconds(1));
  ASSERT_TRUE(pacer.Queue(Key("a", 1), Plans(8), false, /*members=*/3));
  std::optional<BatchPacer::Turn> turn = pacer.Next(true);
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(turn->part_end, 3u);
}

}  // namespace
}  // namespace orthoserve
