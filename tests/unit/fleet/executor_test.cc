// Executors of S fleet ranks as threads over one in-process coordinator, Gloo on loopback and
// the CPU backend: group steps across generations give the engine's answer; a rank that stops
// (frozen, as SIGSTOP would) is dropped, the batch waiting for it ends at the peer timeout —
// not at the collective timeout — and the survivors serve the retry; a graceful leave runs the
// batches already planned with the leaving rank; a restarted rank is taken back.
#include "server/fleet/logic/executor.h"

#include <atomic>
#include <functional>
#include <future>
#include <random>
#include <thread>

#include "common/fleet_change.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/gloo/gloo_collective.h"
#include "server/collective/in_memory_store.h"
#include "server/collective/local_collective.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/unit/fleet/executor_harness.h"
#include "tests/unit/fleet/trainer_step_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

// One carrier from the step layer to the coordinator: a trainer step's spec list is shared, not
// copied, by its ready report and by the coordinator that holds the report (in process, as on
// rank 0), and the report carries its block beside the spec.
TEST(ExecutorTest, TheCoordinatorHoldsTheTrainerStepsOwnSpecList) {
  FleetHarness h(1);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0}));
  const std::vector<float> full = RandomMatrix(3);
  std::shared_ptr<TrainerStep> first = MakeStep({"t", "j", "g", 1, "run"}, 0, 2, full);
  const SharedSpecs& specs = first->sent.specs;
  ASSERT_EQ(specs.use_count(), 1);
  ASSERT_TRUE(specs->front().blocks.empty());
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  h.rank(0).Submit(first, [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  // Trainer rank 1 has not come: the coordinator holds rank 0's report, with the same list.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (h.coordinator().pending_steps() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(h.coordinator().pending_steps(), 1u);
  // The step's, the held report's and the pending step's first list: one list, no copy (a copy
  // anywhere would leave this list to the step alone).
  EXPECT_EQ(specs.use_count(), 3);
  h.rank(0).Submit(MakeStep({"t", "j", "g", 1, "run"}, 1, 2, full), [](StepOutcome) {});
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  StepOutcome o = future.get();
  ASSERT_OK(o.status);
  ASSERT_OK(o.matrices[0]);
}

TEST(ExecutorTest, GroupStepsRunOnEveryGenerationWithTheSameBits) {
  FleetHarness h(3);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1, 2}));
  const std::vector<float> full = RandomMatrix(1);
  const std::vector<float> expected = Reference(h.backend(), full);
  std::vector<std::shared_ptr<TrainerStep>> steps;
  // W = 4 trainers spread over the three ranks.
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 1, "run"}, {0, 0, 1, 2}, full, &steps)) {
    ASSERT_OK(o.status);
    ASSERT_OK(o.matrices[0]);
  }
  EXPECT_EQ(Gather(steps), expected);

  // Rank 2 dies: the others go on as a generation of two with identical results.
  h.Kill(2);
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 2, "run"}, {0, 1, 0, 1}, full, &steps)) ASSERT_OK(o.status);
  EXPECT_EQ(Gather(steps), expected);

  // It restarts and is taken back.
  h.Start(2);
  ASSERT_TRUE(h.WaitFormed({0, 1, 2}));
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 3, "run"}, {2, 2, 1, 0}, full, &steps)) ASSERT_OK(o.status);
  EXPECT_EQ(Gather(steps), expected);
}

TEST(ExecutorTest, AStoppedMemberEndsTheBatchAtThePeerTimeoutAndTheRetrySucceeds) {
  FleetHarness h(3);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1, 2}));
  const std::vector<float> full = RandomMatrix(2);
  // Rank 2 stops answering (reads hang): it no longer takes part in batches or heartbeats.
  h.log(2).Freeze(true);
  absl::SleepFor(absl::Milliseconds(100));
  std::vector<std::shared_ptr<TrainerStep>> steps;
  const absl::Time start = absl::Now();
  std::vector<StepOutcome> first = RunStep(h, {"t", "j", "g", 1, "run"}, {0, 1}, full, &steps);
  const absl::Duration took = absl::Now() - start;
  bool any_failed = false;
  for (const StepOutcome& o : first) {
    if (!o.status.ok()) {
      any_failed = true;
      EXPECT_THAT(o.status, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
      EXPECT_TRUE(IsFleetChange(o.status));
    }
  }
  // Either the batch waited for the stopped rank and was ended by the new generation, or it was
  // planned in that generation already; never the collective timeout.
  EXPECT_LT(took, kPeer + absl::Seconds(5));
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  if (any_failed) {
    for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 1, "run"}, {1, 0}, full, &steps, 1)) ASSERT_OK(o.status);
  }
  EXPECT_EQ(Gather(steps), Reference(h.backend(), full));

  // It resumes: it finds itself dropped, joins again and is taken back.
  h.log(2).Freeze(false);
  ASSERT_TRUE(h.WaitFormed({0, 1, 2}));
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 2, "run"}, {2, 0}, full, &steps)) ASSERT_OK(o.status);
}

TEST(ExecutorTest, EveryMembershipEntryIsToldAsSoonAsItIsReadAndALossIsNotGraceful) {
  // Graceful: ranks joining (a member's restart included) or leaving after their work; never a
  // loss, nor the first generation after this rank joined a coordinator (it knows nothing of what
  // came before: whoever it leaves out is gone).
  FleetHarness h(3);
  struct Seen {
    std::vector<int> ranks;
    bool graceful;
  };
  absl::Mutex mu;
  std::vector<Seen> seen;
  h.OnMembership(0, [&](const std::vector<Member>& members, bool graceful) {
    Seen s{{}, graceful};
    for (const Member& m : members) s.ranks.push_back(m.rank);
    absl::MutexLock lock(&mu);
    seen.push_back(std::move(s));
  });
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1, 2}));
  {
    absl::MutexLock lock(&mu);
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back().ranks, (std::vector<int>{0, 1, 2}));
    EXPECT_FALSE(seen.front().graceful);  // The first after joining.
  }
  h.Kill(2);
  auto wait_for = [&](const std::vector<int>& ranks) {
    const absl::Time deadline = absl::Now() + kPeer + absl::Seconds(10);
    while (absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      absl::MutexLock lock(&mu);
      if (seen.back().ranks == ranks) return true;
    }
    return false;
  };
  ASSERT_TRUE(wait_for({0, 1}));
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(seen.back().graceful);  // Lost.
  }
  h.Start(2);
  ASSERT_TRUE(wait_for({0, 1, 2}));
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(seen.back().graceful);  // Joined.
}

TEST(ExecutorTest, APartialPartitionQuarantinesOneEndAndTheOthersRunGroupSteps) {
  // Ranks 1 and 2 cannot reach each other's collective port: no generation of all three forms.
  FleetHarness h(3);
  h.RefuseJoin([](int rank, const CollectiveGroup& g) { return g.world == 3 && rank != 0; });
  h.StartAll();
  // One end goes (the one whose third failure the coordinator heard first, or rank 2 on a tie).
  auto quarantined_end = [&h] {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (h.coordinator().quarantined().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    const std::vector<int> q = h.coordinator().quarantined();
    return q.size() == 1 && q[0] != 0 ? q[0] : -1;
  };
  const int out = quarantined_end();
  ASSERT_NE(out, -1);
  const int other = 3 - out;
  ASSERT_TRUE(h.WaitFormed({0, other}, absl::Seconds(20)));
  EXPECT_FALSE(h.rank(out).view().member);
  const std::vector<float> full = RandomMatrix(5);
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 1, "run"}, {0, other}, full, &steps)) ASSERT_OK(o.status);
  EXPECT_EQ(Gather(steps), Reference(h.backend(), full));

  // Taken back after its 2 s, the generation fails to form again: the same rank goes out again
  // (for twice as long), and steps go on.
  const Generation before = h.coordinator().generation();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (h.coordinator().generation().number < before.number + 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(h.WaitFormed({0, other}, absl::Seconds(20)));
  EXPECT_EQ(h.coordinator().quarantined(), std::vector<int>{out});
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 2, "run"}, {other, 0}, full, &steps)) ASSERT_OK(o.status);
}

TEST(ExecutorTest, AGracefulLeaveRunsWhatWasPlannedAndTheFleetGoesOn) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(3);
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 1, "run"}, {0, 1}, full, &steps)) ASSERT_OK(o.status);
  ASSERT_OK(h.rank(1).Leave(absl::Seconds(5)));
  EXPECT_FALSE(h.rank(1).view().member);
  ASSERT_TRUE(h.WaitFormed({0}));
  for (const StepOutcome& o : RunStep(h, {"t", "j", "g", 2, "run"}, {0, 0}, full, &steps)) ASSERT_OK(o.status);
  EXPECT_EQ(Gather(steps), Reference(h.backend(), full));
  // A rank outside the generation refuses steps with a retryable UNAVAILABLE.
  std::vector<StepOutcome> refused = RunStep(h, {"t", "j", "g", 3, "run"}, {1}, full, &steps);
  EXPECT_THAT(refused[0].status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not a member")));
  EXPECT_TRUE(IsFleetChange(refused[0].status));
}

TEST(ExecutorTest, AResultLostAfterItsBatchRanIsReplayedWithTheSameBits) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(5);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (const StepOutcome& o : RunStep(h, key, {0, 1}, full, &steps)) ASSERT_OK(o.status);
  const std::vector<char> first = steps[1]->outputs[0];
  // Trainer rank 1's result never reached it: it retries the step (on rank 0 this time) after
  // the other trainer has moved on. The members kept the inputs, so the step runs again.
  ExpectReplayed(h.rank(0), MakeStep(key, 1, 2, full, /*attempt=*/1), first);
}

// Both trainer ranks lost their results and retry at once, each on the member that kept its
// original: the coordinator plans one replay per retry (each taking the other's kept inputs),
// before either has run. The first replay must neither fail the second retry as "superseded" nor
// drop the kept original the second replay takes (it ran the retry of the same trainer rank).
TEST(ExecutorTest, TwoRetriesThatStartTwoReplaysAtOnceBothGetTheSameBits) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(8);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (const StepOutcome& o : RunStep(h, key, {0, 1}, full, &steps)) ASSERT_OK(o.status);
  // The members' notices of what they keep reach the coordinator with their next reads: from
  // then on each retry's report alone completes a replay.
  absl::SleepFor(absl::Milliseconds(400));
  std::vector<std::shared_ptr<TrainerStep>> retries;
  std::vector<std::future<StepOutcome>> futures;
  for (int r = 0; r < 2; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    retries.push_back(MakeStep(key, r, 2, full, /*attempt=*/1));
    h.rank(r).Submit(retries.back(), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(futures[r].wait_for(std::chrono::seconds(10)), std::future_status::ready);
    StepOutcome o = futures[r].get();
    ASSERT_TRUE(o.status.ok()) << "trainer rank " << r << ": " << o.status;
    ASSERT_TRUE(o.matrices[0].ok()) << "trainer rank " << r << ": " << o.matrices[0];
    EXPECT_EQ(retries[r]->outputs[0], steps[r]->outputs[0]) << "trainer rank " << r;
  }
}

TEST(ExecutorTest, ARankRunningTwoTrainersLeavesCopiesSoItsDeathCanBeReplayed) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(7);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps;
  // Trainer ranks 0 and 1 on fleet rank 0, 2 and 3 on fleet rank 1.
  for (const StepOutcome& o : RunStep(h, key, {0, 0, 1, 1}, full, &steps)) ASSERT_OK(o.status);
  const std::vector<char> first = steps[0]->outputs[0];
  // Fleet rank 0 dies having delivered trainer rank 1's result but not trainer rank 0's: the
  // replay of rank 0's retry needs rank 1's inputs, which only fleet rank 1's copy still has.
  h.Kill(0);
  ASSERT_TRUE(h.WaitFormed({1}));
  ExpectReplayed(h.rank(1), MakeStep(key, 0, 4, full, /*attempt=*/1), first);
}

// Trainer rank `r` of `world`'s row blocks of the matrices `fulls` (each rows x cols), one per
// algorithm, as one step (matrix i named "w<i>").
std::shared_ptr<TrainerStep> MultiStep(const GroupKey& key, int r, int world, const std::vector<std::vector<float>>& fulls,
                                       const std::vector<Algorithm>& algorithms, int attempt = 0, int rows = kRows,
                                       int cols = kCols) {
  std::shared_ptr<TrainerStep> step;
  SpecList specs;
  std::vector<Block> blocks;
  for (size_t i = 0; i < fulls.size(); ++i) {
    std::shared_ptr<TrainerStep> one =
        testing::RowBlockStep(key, r, world, rows, cols, fulls[i], Highest(), algorithms[i], attempt);
    specs.push_back(one->sent.spec(0));
    specs.back().name = absl::StrCat("w", i);
    blocks.push_back(one->sent.blocks[0]);
    if (step == nullptr) {
      step = one;
      continue;
    }
    step->inputs.push_back(one->inputs[0]);
  }
  step->sent = SenderBlocks(std::move(specs), std::move(blocks));
  testing::SetDigest(*step);
  return step;
}

// A step of five matrices, one of each algorithm, on two ranks with W = 4 (two trainer ranks on
// each): its outputs by trainer rank, then matrix, and how many log entries rank 0 applied for it.
struct MultiRun {
  std::vector<std::vector<std::vector<char>>> outputs;
  int entries = 0;
};
MultiRun RunMultiStep(FleetHarness& h, const GroupKey& key, const std::vector<std::vector<float>>& fulls,
                      const std::vector<Algorithm>& algorithms, int expected_entries) {
  const std::vector<int> placement = {0, 0, 1, 1};
  const int world = static_cast<int>(placement.size());
  const int before = h.steps_applied_on_0();
  std::vector<std::future<StepOutcome>> futures;
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (int r = 0; r < world; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    steps.push_back(MultiStep(key, r, world, fulls, algorithms));
    h.rank(placement[r]).Submit(steps.back(), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  MultiRun run;
  for (int r = 0; r < world; ++r) {
    if (futures[r].wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << "trainer rank " << r << " did not finish";
      return run;
    }
    StepOutcome o = futures[r].get();
    EXPECT_OK(o.status);
    EXPECT_EQ(o.matrices.size(), fulls.size());
    for (const absl::Status& m : o.matrices) EXPECT_OK(m);
    run.outputs.push_back(steps[r]->outputs);
  }
  // Rank 0 counts the last entry after it has resolved the step's trainer ranks.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (h.steps_applied_on_0() - before < expected_entries && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  run.entries = h.steps_applied_on_0() - before;
  return run;
}

// With parts of (almost) no time, the coordinator divides a step into parts of one matrix per
// member (2, 2 and 1 of the five matrices, each algorithm's in its own place), and every output
// has the bits of the same step run whole. The members keep the whole step: a trainer rank whose fleet rank died after the
// last part is replayed from the copies, every matrix with the same bits (TP_DISTRIBUTED's up to
// rounding: its replay runs on one rank, not two).
TEST(ExecutorTest, ADividedStepHasTheBitsOfTheWholeStepAndIsReplayedWhole) {
  const std::vector<Algorithm> algorithms = {Algorithm::kAuto, Algorithm::kRowSharded, Algorithm::kGathered,
                                             Algorithm::kTpDuplicated, Algorithm::kTpDistributed};
  std::vector<std::vector<float>> fulls;
  for (size_t i = 0; i < algorithms.size(); ++i) fulls.push_back(RandomMatrix(20 + static_cast<int>(i)));
  const GroupKey key{"t", "j", "g", 1, "run"};
  MultiRun whole;
  {
    FleetHarness h(2, /*batch_window=*/1);
    h.StartAll();
    ASSERT_TRUE(h.WaitPaced({0, 1}));
    whole = RunMultiStep(h, key, fulls, algorithms, 1);
  }
  EXPECT_EQ(whole.entries, 1);
  FleetHarness h(2, /*batch_window=*/1, /*part_time=*/absl::Nanoseconds(1));
  h.StartAll();
  ASSERT_TRUE(h.WaitPaced({0, 1}));
  MultiRun divided = RunMultiStep(h, key, fulls, algorithms, 3);
  EXPECT_EQ(divided.entries, 3);
  ASSERT_EQ(divided.outputs.size(), whole.outputs.size());
  for (size_t r = 0; r < whole.outputs.size(); ++r) {
    for (size_t i = 0; i < algorithms.size(); ++i) {
      EXPECT_FALSE(divided.outputs[r][i].empty());
      EXPECT_EQ(divided.outputs[r][i], whole.outputs[r][i])
          << "trainer rank " << r << ", matrix " << i << " (" << AlgorithmName(algorithms[i]) << ")";
    }
  }
  // Fleet rank 0 (trainer ranks 0 and 1) dies; trainer rank 0 retries on fleet rank 1.
  h.Kill(0);
  ASSERT_TRUE(h.WaitFormed({1}));
  std::shared_ptr<TrainerStep> retry = MultiStep(key, 0, 4, fulls, algorithms, /*attempt=*/1);
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  h.rank(1).Submit(retry, [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  StepOutcome o = future.get();
  ASSERT_OK(o.status);
  ASSERT_EQ(o.matrices.size(), algorithms.size());
  for (size_t i = 0; i < algorithms.size(); ++i) {
    ASSERT_OK(o.matrices[i]);
    if (algorithms[i] != Algorithm::kTpDistributed) {
      EXPECT_EQ(retry->outputs[i], whole.outputs[0][i]) << "matrix " << i;
      continue;
    }
    // TP_DISTRIBUTED sums its Gram matrices over the fleet's ranks, now one: the same up to rounding.
    ASSERT_EQ(retry->outputs[i].size(), whole.outputs[0][i].size());
    const float* got = reinterpret_cast<const float*>(retry->outputs[i].data());
    const float* want = reinterpret_cast<const float*>(whole.outputs[0][i].data());
    for (size_t k = 0; k < retry->outputs[i].size() / sizeof(float); ++k) EXPECT_NEAR(got[k], want[k], 1e-5) << k;
  }
}

// A member lost between two parts of a divided step: rank 1 stops hearing the log right after the
// first part (before the second is appended), so rank 0 waits for it in the second part until
// the peer timeout drops it. Both trainer ranks get a retryable UNAVAILABLE, nothing half done
// is delivered, and their retry runs on the survivor with the engine's answer.
TEST(ExecutorTest, AMemberLostBetweenPartsFailsTheStepRetryablyAndTheRetrySucceeds) {
  FleetHarness h(2, /*batch_window=*/1, /*part_time=*/absl::Nanoseconds(1));
  h.OnAppliedByZero([&h](int applied) {
    if (applied == 1) h.log(1).Freeze(true);
  });
  h.StartAll();
  ASSERT_TRUE(h.WaitPaced({0, 1}));
  const std::vector<Algorithm> algorithms(4, Algorithm::kAuto);
  std::vector<std::vector<float>> fulls;
  for (int i = 0; i < 4; ++i) fulls.push_back(RandomMatrix(40 + i));
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::future<StepOutcome>> futures;
  for (int r = 0; r < 2; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    h.rank(r).Submit(MultiStep(key, r, 2, fulls, algorithms), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(futures[r].wait_for(std::chrono::seconds(20)), std::future_status::ready) << "trainer rank " << r;
    StepOutcome o = futures[r].get();
    EXPECT_THAT(o.status, StatusIs(absl::StatusCode::kUnavailable, ::testing::_)) << "trainer rank " << r;
    EXPECT_TRUE(IsFleetChange(o.status)) << "trainer rank " << r;
  }
  h.Kill(1);
  ASSERT_TRUE(h.WaitFormed({0}));
  std::vector<std::shared_ptr<TrainerStep>> retries;
  futures.clear();
  for (int r = 0; r < 2; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    retries.push_back(MultiStep(key, r, 2, fulls, algorithms, /*attempt=*/1));
    h.rank(0).Submit(retries.back(), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(futures[r].wait_for(std::chrono::seconds(20)), std::future_status::ready) << "retry of " << r;
    StepOutcome o = futures[r].get();
    ASSERT_OK(o.status);
    for (const absl::Status& m : o.matrices) ASSERT_OK(m);
  }
  for (int i = 0; i < 4; ++i) {
    std::vector<float> got;
    for (const auto& s : retries) {
      const float* f = reinterpret_cast<const float*>(s->outputs[i].data());
      got.insert(got.end(), f, f + s->outputs[i].size() / sizeof(float));
    }
    EXPECT_EQ(got, Reference(h.backend(), fulls[i])) << "matrix " << i;
  }
}

// A graceful shutdown (Executor::Shutdown, as at SIGTERM) while a part of a divided step runs:
// the part's record is the applier's while it runs, so the shutdown frees nothing under it, and
// the step's trainer ranks get UNAVAILABLE at once instead of waiting forever (the shutdown used
// to clear the record that the running part then wrote its results and steps into: a
// use-after-free, and steps nobody resolved). One member, three 1536 x 1536 matrices, so three parts
// of about a second each here; the shutdown comes while the second runs.
TEST(ExecutorTest, AShutdownWhileADividedStepsPartRunsFailsItsStepsRetryably) {
  constexpr int kN = 1536;
  FleetHarness h(1, /*batch_window=*/1, /*part_time=*/absl::Nanoseconds(1));
  std::thread stopper;
  h.OnAppliedByZero([&h, &stopper](int applied) {
    // After the first part, before the second is appended (pacing): the second runs when this
    // returns, and is well inside its computation 300 ms later.
    if (applied == 1) {
      stopper = std::thread([&h] {
        absl::SleepFor(absl::Milliseconds(300));
        h.rank(0).Shutdown();
      });
    }
  });
  h.StartAll();
  ASSERT_TRUE(h.WaitPaced({0}));
  std::vector<std::vector<float>> fulls;
  for (int i = 0; i < 3; ++i) {
    std::mt19937 gen(60 + i);
    std::normal_distribution<float> dist;
    fulls.emplace_back(kN * kN);
    for (float& v : fulls.back()) v = dist(gen);
  }
  const std::vector<Algorithm> algorithms(3, Algorithm::kAuto);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::future<StepOutcome>> futures;
  for (int r = 0; r < 2; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    h.rank(0).Submit(MultiStep(key, r, 2, fulls, algorithms, 0, kN, kN),
                     [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(futures[r].wait_for(std::chrono::seconds(20)), std::future_status::ready) << "trainer rank " << r;
    StepOutcome o = futures[r].get();
    EXPECT_THAT(o.status, StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("shutting down")))
        << "trainer rank " << r;
  }
  stopper.join();
  // The second part ran through the shutdown (it is applied once its steps were failed).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (h.steps_applied_on_0() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(h.steps_applied_on_0(), 2) << "the shutdown did not come while the second part ran";
}

TEST(ExecutorTest, AReplayTakesEachKeptStepFromOneHolder) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(8);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (const StepOutcome& o : RunStep(h, key, {0, 0, 1, 1}, full, &steps)) ASSERT_OK(o.status);
  const std::vector<char> first = steps[0]->outputs[0];
  // Both ranks live: trainer rank 1's inputs are kept on fleet rank 0 and copied to fleet rank 1;
  // the replay must take them from one of the two only.
  absl::SleepFor(absl::Milliseconds(200));  // The notices of both reach the coordinator.
  ExpectReplayed(h.rank(1), MakeStep(key, 0, 4, full, /*attempt=*/1), first);
}

TEST(ExecutorTest, AReplayWorksAcrossACoordinatorRestart) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(6);
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps;
  for (const StepOutcome& o : RunStep(h, key, {0, 1}, full, &steps)) ASSERT_OK(o.status);
  const std::vector<char> first = steps[1]->outputs[0];
  // The coordinator restarts (it knows nothing of step 1); the ranks join its new epoch and tell
  // it what they keep, so trainer rank 1's retry still finds trainer rank 0's inputs.
  const uint64_t old_epoch = h.rank(0).view().epoch;
  h.RestartCoordinator();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((h.rank(0).view().epoch == old_epoch || h.rank(1).view().epoch == old_epoch) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_NE(h.rank(0).view().epoch, old_epoch);
  ASSERT_NE(h.rank(1).view().epoch, old_epoch);
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  ExpectReplayed(h.rank(1), MakeStep(key, 1, 2, full, /*attempt=*/1), first);
}

TEST(ExecutorTest, ALostCoordinatorFailsWaitingStepsWithinThePeerTimeout) {
  FleetHarness h(2);
  h.StartAll();
  ASSERT_TRUE(h.WaitFormed({0, 1}));
  const std::vector<float> full = RandomMatrix(4);
  // Trainer rank 0 reports through rank 1; trainer rank 1 never comes. Then rank 1 loses the
  // coordinator: the step fails with UNAVAILABLE well before the rendezvous timeout.
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  h.rank(1).Submit(MakeStep({"t", "j", "g", 1, "run"}, 0, 2, full), [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  h.log(1).Freeze(true);
  ASSERT_EQ(future.wait_for(std::chrono::milliseconds(absl::ToInt64Milliseconds(kPeer + absl::Seconds(5)))),
            std::future_status::ready);
  StepOutcome o = future.get();
  EXPECT_THAT(o.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("unreachable")));
  EXPECT_TRUE(IsFleetChange(o.status));
  EXPECT_FALSE(h.rank(1).view().formed);
  EXPECT_OK(h.rank(1).Liveness());
}

// A step that comes while its rank is not (yet) a member of a formed generation waits for one:
// trainer rank 0's step comes to rank 1 before rank 1 has even joined, and runs (with the
// engine's bits) in the generation that forms when it does. Without a hold it fails at once.
TEST(ExecutorTest, AStepSubmittedWhileTheFleetReformsIsHeldUntilItsGenerationForms) {
  FleetHarness h(2);
  h.Hold(absl::Seconds(20));
  h.Start(0);
  ASSERT_TRUE(h.WaitFormed({0}));
  const std::vector<float> full = RandomMatrix(11);
  h.log(1).Freeze(true);  // Rank 1 cannot join yet: its step must wait, not fail.
  h.Start(1);
  EXPECT_TRUE(h.rank(1).TakesSteps());
  const GroupKey key{"t", "j", "g", 1, "run"};
  std::vector<std::shared_ptr<TrainerStep>> steps = {MakeStep(key, 0, 2, full), MakeStep(key, 1, 2, full)};
  std::vector<std::future<StepOutcome>> futures;
  for (int r = 0; r < 2; ++r) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    futures.push_back(promise->get_future());
    h.rank(1 - r).Submit(steps[r], [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(futures[0].wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the held step failed";
  EXPECT_EQ(h.rank(1).waiting(), 1u);
  h.log(1).Freeze(false);
  for (auto& f : futures) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    StepOutcome o = f.get();
    ASSERT_OK(o.status);
    ASSERT_OK(o.matrices[0]);
  }
  EXPECT_EQ(Gather(steps), Reference(h.backend(), full));
}

TEST(ExecutorTest, WithoutAHoldAStepOnARankOutsideAFormedGenerationFailsAtOnce) {
  FleetHarness h(2);
  h.log(1).Freeze(true);
  h.Start(1);
  EXPECT_FALSE(h.rank(1).TakesSteps());
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  h.rank(1).Submit(MakeStep({"t", "j", "g", 1, "run"}, 0, 2, RandomMatrix(12)),
                   [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  ASSERT_EQ(future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  StepOutcome o = future.get();
  EXPECT_THAT(o.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not a member of a formed fleet generation")));
  EXPECT_TRUE(IsFleetChange(o.status));
}

// A hold is bounded: no generation within it fails the step as retryable (to go elsewhere).
TEST(ExecutorTest, AHeldStepFailsRetryablyWhenNoGenerationFormsWithinTheHold) {
  FleetHarness h(2);
  h.Hold(absl::Milliseconds(400));
  h.log(1).Freeze(true);
  h.Start(1);
  auto promise = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> future = promise->get_future();
  const absl::Time start = absl::Now();
  h.rank(1).Submit(MakeStep({"t", "j", "g", 1, "run"}, 0, 2, RandomMatrix(13)),
                   [promise](StepOutcome o) { promise->set_value(std::move(o)); });
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  const absl::Duration took = absl::Now() - start;
  StepOutcome o = future.get();
  EXPECT_THAT(o.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("did not become a member")));
  EXPECT_TRUE(IsFleetChange(o.status));
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_EQ(h.rank(1).waiting(), 0u);
}

// A held step leaves with its trainer (AbortStep), and at once when the rank leaves or stops.
TEST(ExecutorTest, AHeldStepEndsWithItsTrainersAbortAndAtLeaveAndShutdown) {
  FleetHarness h(2);
  h.Hold(absl::Seconds(30));
  h.log(1).Freeze(true);
  h.Start(1);
  auto submit = [&](int64_t step) {
    auto promise = std::make_shared<std::promise<StepOutcome>>();
    std::shared_ptr<TrainerStep> s = MakeStep({"t", "j", "g", step, "run"}, 0, 2, RandomMatrix(14));
    h.rank(1).Submit(s, [promise](StepOutcome o) { promise->set_value(std::move(o)); });
    return std::make_pair(s, promise->get_future());
  };
  auto [aborted, aborted_done] = submit(1);
  EXPECT_NE(aborted->submission, 0u);
  h.rank(1).AbortStep(aborted->key, 0, absl::CancelledError("the trainer cancelled its stream"), aborted->submission);
  ASSERT_EQ(aborted_done.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  EXPECT_THAT(aborted_done.get().status, StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled")));

  auto [left, left_done] = submit(2);
  EXPECT_OK(h.rank(1).Leave(absl::Seconds(1)));  // Not a member: nothing to leave.
  ASSERT_EQ(left_done.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  EXPECT_THAT(left_done.get().status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("leaving")));
  EXPECT_FALSE(h.rank(1).TakesSteps());

  h.Start(1);  // A fresh process.
  auto [stopped, stopped_done] = submit(3);
  h.rank(1).Shutdown();
  ASSERT_EQ(stopped_done.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  EXPECT_THAT(stopped_done.get().status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  EXPECT_EQ(h.rank(1).waiting(), 0u);
}

}  // namespace
}  // namespace orthoserve
