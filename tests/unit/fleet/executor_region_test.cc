// Group steps whose trainer ranks' blocks are in shared-memory regions (TrainerStep::input_at,
// output_at; issue #28), on executors as threads (executor_harness.h): the batch reads the inputs
// in place and writes the results into the regions with the bits of bytes, ranks and blocks in
// regions mix with ranks in bytes, and a replay answers a retry in the slice the retry names (or
// in bytes) from the kept copy of the inputs, never from regions the trainers reuse.
#include <algorithm>
#include <future>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fleet/executor_harness.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::testing::IsEmpty;

// A trainer's region for one block: its input (a copy of `step`'s bytes) and room for its result.
struct FakeRegion {
  std::vector<char> input;
  std::vector<char> result;
};

// Moves `step`'s block 0 into `region` as FleetStep hands over a trainer's slices: its input read
// there (when `input`), its result written there (when `result`); `lease` stands for the regions'
// leases.
void InRegion(TrainerStep& step, FakeRegion& region, bool input, bool result, std::shared_ptr<const void> lease) {
  step.input_at.assign(1, nullptr);
  step.output_at.assign(1, nullptr);
  if (input) {
    region.input = step.inputs[0];
    step.inputs[0].clear();
    step.input_at[0] = region.input.data();
  }
  if (result) {
    region.result.assign(static_cast<size_t>(step.sent.blocks[0].numel()) * sizeof(float), '\x7f');
    step.output_at[0] = region.result.data();
  }
  step.regions = std::move(lease);
}

// Submits `steps[r]` to fleet rank `placement[r]`; the outcomes in trainer rank order.
std::vector<StepOutcome> Submit(FleetHarness& h, const std::vector<int>& placement,
                                const std::vector<std::shared_ptr<TrainerStep>>& steps) {
  std::vector<std::future<StepOutcome>> futures;
  for (size_t r = 0; r < steps.size(); ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    h.rank(placement[r]).Submit(steps[r], [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  std::vector<StepOutcome> out;
  for (auto& f : futures) {
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << "a step did not finish";
      out.emplace_back();
      out.back().status = absl::DeadlineExceededError("test wait");
      continue;
    }
    out.push_back(f.get());
  }
  return out;
}

// Trainer rank r's rows of `full`'s result, as bytes.
std::vector<char> Rows(const std::vector<float>& full, int r, int world) {
  const int64_t rows = kRows / world;
  const char* begin = reinterpret_cast<const char*>(full.data() + r * rows * kCols);
  return std::vector<char>(begin, begin + rows * kCols * sizeof(float));
}

// W = 4 trainers on two members, each in another way: input and result in a region, input only,
// result only, bytes only. Every result has the engine's bits (those of a step in bytes), each
// where its trainer asked for it; the members keep copies of the inputs, not the regions.
TEST(ExecutorRegionTest, BlocksInRegionsHaveTheBitsOfBytesAndMixWithBlocksInBytes) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(41);
  const std::vector<float> expected = Reference(h.backend(), full);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps;
  std::vector<FakeRegion> regions(4);
  auto lease = std::make_shared<int>(0);
  std::weak_ptr<int> watch = lease;
  for (int r = 0; r < 4; ++r) {
    steps.push_back(MakeStep(key, r, 4, full));
    if (r < 3) InRegion(*steps[r], regions[r], /*input=*/r != 2, /*result=*/r != 1, lease);
  }
  lease.reset();
  const std::vector<StepOutcome> outcomes = Submit(h, {0, 0, 1, 1}, steps);
  for (const StepOutcome& o : outcomes) {
    ASSERT_OK(o.status);
    ASSERT_OK(o.matrices[0]);
  }
  EXPECT_EQ(regions[0].result, Rows(expected, 0, 4));
  EXPECT_EQ(steps[1]->outputs[0], Rows(expected, 1, 4));
  EXPECT_EQ(regions[2].result, Rows(expected, 2, 4));
  EXPECT_EQ(steps[3]->outputs[0], Rows(expected, 3, 4));
  EXPECT_THAT(steps[0]->outputs[0], IsEmpty());  // Written into the region only.
  EXPECT_THAT(steps[2]->outputs[0], IsEmpty());
  // Kept for replays with their own copy of the inputs, holding no region.
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(r);
    EXPECT_THAT(steps[r]->input_at, IsEmpty());
    EXPECT_THAT(steps[r]->output_at, IsEmpty());
    EXPECT_EQ(steps[r]->inputs[0], Rows(full, r, 4));
  }
  EXPECT_TRUE(watch.expired());  // No lease is held after the step, though its steps are kept.
}

// Trainer rank 1 lost its result and retries after both trainers reused their regions: the
// replay takes trainer 0's inputs from the member's copy (not from its region, which now holds
// other bytes) and writes the result into the slice the retry names — another slice than the
// first attempt's, which is left alone — or, for a retry that names none, into bytes.
TEST(ExecutorRegionTest, AReplayAnswersARetryInTheSliceItNamesFromTheKeptInputs) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(42);
  const std::vector<float> expected = Reference(h.backend(), full);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<FakeRegion> regions(2);
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (int r = 0; r < 2; ++r) {
    steps.push_back(MakeStep(key, r, 2, full));
    InRegion(*steps[r], regions[r], true, true, nullptr);
  }
  for (const StepOutcome& o : Submit(h, {0, 1}, steps)) ASSERT_OK(o.status);
  ASSERT_EQ(regions[1].result, Rows(expected, 1, 2));
  // Both trainers go on to their next step in the same regions.
  for (FakeRegion& region : regions) {
    std::fill(region.input.begin(), region.input.end(), '\x01');
    std::fill(region.result.begin(), region.result.end(), '\x02');
  }
  // The retry, on the other member, with its input and result in a new region.
  FakeRegion second;
  std::shared_ptr<TrainerStep> retry = MakeStep(key, 1, 2, full, /*attempt=*/1);
  InRegion(*retry, second, true, true, nullptr);
  const std::vector<StepOutcome> replayed = Submit(h, {0}, {retry});
  ASSERT_OK(replayed[0].status);
  ASSERT_OK(replayed[0].matrices[0]);
  EXPECT_EQ(second.result, Rows(expected, 1, 2));
  EXPECT_EQ(regions[1].result, std::vector<char>(regions[1].result.size(), '\x02'));  // The first slice: untouched.
  EXPECT_EQ(regions[0].result, std::vector<char>(regions[0].result.size(), '\x02'));  // Trainer 0's: untouched.
  // A further retry in bytes gets bytes.
  ExpectReplayed(h.rank(1), MakeStep(key, 1, 2, full, /*attempt=*/2), Rows(expected, 1, 2));
}

// TakeRegionInputs copies what a step read in place and lets the regions go; a region that no
// longer holds the digested bytes (the trainer changed it during the step) makes the step
// unfit for replays.
TEST(ExecutorRegionTest, AStepWhoseRegionChangedSinceItWasDigestedIsNotKept) {
  const std::vector<float> full = RandomMatrix(43);
  const GroupKey key{"t", "j", "g", 1, "run"};
  for (bool changed : {false, true}) {
    SCOPED_TRACE(changed);
    std::shared_ptr<TrainerStep> step = MakeStep(key, 0, 2, full);
    FakeRegion region;
    auto lease = std::make_shared<int>(0);
    std::weak_ptr<int> watch = lease;
    InRegion(*step, region, true, true, std::move(lease));
    if (changed) region.input[5] ^= 1;
    EXPECT_EQ(TakeRegionInputs(*step), !changed);
    EXPECT_EQ(step->inputs[0], region.input);
    EXPECT_THAT(step->input_at, IsEmpty());
    EXPECT_THAT(step->output_at, IsEmpty());
    EXPECT_TRUE(watch.expired());
  }
}

}  // namespace
}  // namespace orthoserve
