// The coordinator's membership and step logic without a network: generations as ranks join,
// restart, leave and fall silent; which reports it takes and which it withdraws; retries
// against duplicates; plans on collective ranks; capped messages.
#include "server/fleet/logic/coordinator.h"

#include <algorithm>
#include <functional>
#include <thread>

#include "common/fleet_change.h"
#include "common/ns_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kPeer = absl::Milliseconds(400);

Coordinator::Options TestOptions(int world) {
  Coordinator::Options o;
  o.fleet_world = world;
  o.peer_timeout = kPeer;
  o.reform_delay = absl::Milliseconds(20);
  o.rendezvous_timeout = absl::Seconds(30);
  return o;
}

Member M(int rank, uint64_t incarnation) { return Member{rank, absl::StrCat("127.0.0.1:", 5000 + rank), incarnation}; }

// Reads as rank `m` would (its heartbeat) and returns the entries from `from`.
std::vector<LogEntry> ReadAll(Coordinator& c, const Member& m, int64_t from, int64_t formed = 0) {
  absl::StatusOr<std::vector<LogEntry>> entries =
      c.Read(ReaderState{m.rank, c.epoch(), m.incarnation, formed, 0, {}}, from, absl::Milliseconds(1));
  EXPECT_OK(entries.status());
  return entries.ok() ? *entries : std::vector<LogEntry>{};
}

// Waits (bounded) until the coordinator's generation number reaches `n`.
Generation WaitGeneration(Coordinator& c, int64_t n, const std::vector<Member>& heartbeat = {}) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (c.generation().number < n && absl::Now() < deadline) {
    for (const Member& m : heartbeat) ReadAll(c, m, 0);
    absl::SleepFor(absl::Milliseconds(5));
  }
  return c.generation();
}

ReadyReport Report(const Coordinator& c, const GroupKey& key, int trainer_rank, int world, const Member& fleet_rank,
                   uint64_t submission, int attempt = 0) {
  ReadyReport r;
  r.key = key;
  r.trainer_rank = trainer_rank;
  r.trainer_world = world;
  r.fleet_rank = fleet_rank.rank;
  r.incarnation = fleet_rank.incarnation;
  r.epoch = c.epoch();
  r.submission = submission;
  r.attempt = attempt;
  MatrixPlan m;
  m.name = "w";
  m.shape = {4, 4};
  m.view = Matrix2d{4, 4};
  r.sent = SenderBlocks(SpecList{m}, {Block{trainer_rank * (4 / world), 0, 4 / world, 4}});
  return r;
}

// The batch and failure entries of `key` in `entries`.
std::vector<LogEntry> EntriesFor(const std::vector<LogEntry>& entries, const GroupKey& key) {
  std::vector<LogEntry> out;
  for (const LogEntry& e : entries) {
    if (!e.membership() && e.key == key) out.push_back(e);
  }
  return out;
}

TEST(CoordinatorTest, RanksJoiningTogetherFormOneGenerationInRankOrder) {
  auto c = Coordinator::Create(TestOptions(3));
  ASSERT_OK(c);
  const std::vector<Member> members = {M(0, 10), M(1, 11), M(2, 22)};
  ASSERT_OK((*c)->Join(members[2]).status());
  ASSERT_OK((*c)->Join(members[0]).status());
  ASSERT_OK((*c)->Join(members[1]).status());
  Generation g = WaitGeneration(**c, 1);
  EXPECT_EQ(g.number, 1);
  ASSERT_EQ(g.members.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(g.members[r].rank, r);
  EXPECT_FALSE(g.formed);
  std::vector<LogEntry> log = ReadAll(**c, M(0, 10), 0);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_TRUE(log[0].membership());
  EXPECT_EQ(log[0].generation, 1);
  // Formed once every member says it joined the generation's collective.
  for (const Member& m : members) {
    EXPECT_FALSE((*c)->generation().formed);
    ReadAll(**c, m, 1, /*formed=*/1);
  }
  EXPECT_TRUE((*c)->generation().formed);
  EXPECT_THAT((*c)->Join(M(3, 33)).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
}

TEST(CoordinatorTest, RestartLossAndLeaveEachStartANewGeneration) {
  auto c = Coordinator::Create(TestOptions(3));
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11), M(2, 22)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  ASSERT_EQ(WaitGeneration(**c, 1, members).members.size(), 3u);

  // Rank 2 restarts: the next generation starts at once, with the new incarnation in place of
  // the old one (whose batches cannot run any more).
  members[2] = M(2, 23);
  ASSERT_OK((*c)->Join(members[2]).status());
  Generation g = (*c)->generation();
  EXPECT_EQ(g.number, 2);
  ASSERT_EQ(g.members.size(), 3u);
  EXPECT_EQ(g.members[2].incarnation, 23u);
  // The old incarnation must join again.
  EXPECT_THAT((*c)->Read(ReaderState{2, (*c)->epoch(), 22, 0, 0, {}}, 0, absl::Milliseconds(1)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("join again")));

  // Rank 1 leaves gracefully: the next generation goes without it, and it can still read
  // until it has seen that.
  ASSERT_OK((*c)->Leave(1, 11, (*c)->epoch()));
  g = (*c)->generation();
  EXPECT_EQ(g.number, 3);
  ASSERT_EQ(g.members.size(), 2u);
  EXPECT_EQ(g.members[1].rank, 2);
  EXPECT_OK((*c)->Read(ReaderState{1, (*c)->epoch(), 11, 0, 0, {}}, 0, absl::Milliseconds(1)).status());

  // Rank 2 falls silent (rank 0 keeps reading): lost after the peer timeout.
  const absl::Time silent = absl::Now();
  g = WaitGeneration(**c, 4, {members[0]});
  EXPECT_EQ(g.number, 4);
  ASSERT_EQ(g.members.size(), 1u);
  EXPECT_EQ(g.members[0].rank, 0);
  EXPECT_GE(absl::Now() - silent, kPeer);
  EXPECT_LT(absl::Now() - silent, kPeer + absl::Seconds(2));
}

// With an elected coordinator, etcd's liveness keys say who is alive: a member whose key was
// listed and is gone is lost at once (not at the peer timeout, though it kept reading here); a
// rank not yet listed, another incarnation's key, and a leaving rank's key are no loss.
TEST(CoordinatorTest, AMemberWhoseEtcdKeyIsGoneIsLostAtOnce) {
  Coordinator::Options o = TestOptions(3);
  o.peer_timeout = absl::Seconds(30);  // Far beyond the test: only the listing can drop a rank.
  auto c = Coordinator::Create(o);
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11), M(2, 22)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  ASSERT_EQ(WaitGeneration(**c, 1, members).members.size(), 3u);

  (*c)->Listed({{0, 10}, {1, 11}});  // Rank 2's key has not come yet: nothing happens.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ((*c)->generation().number, 1);
  (*c)->Listed({{0, 10}, {1, 11}, {2, 99}});  // Another process's key for rank 2: not this one's.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ((*c)->generation().number, 1);
  (*c)->Listed({{0, 10}, {1, 11}, {2, 22}});
  (*c)->Listed({{0, 10}, {1, 11}, {2, 22}});
  EXPECT_EQ((*c)->generation().number, 1);

  // Rank 2's lease ends (it keeps reading, as a stopped process's last reads may still arrive).
  const absl::Time gone = absl::Now();
  (*c)->Listed({{0, 10}, {1, 11}});
  Generation g = WaitGeneration(**c, 2, members);
  EXPECT_EQ(g.number, 2);
  ASSERT_EQ(g.members.size(), 2u);
  EXPECT_EQ(g.members[1].rank, 1);
  EXPECT_LT(absl::Now() - gone, absl::Seconds(2));

  // Rank 1 leaves gracefully, then its key goes: the leave made the generation, not a loss.
  ASSERT_OK((*c)->Leave(1, 11, (*c)->epoch()));
  EXPECT_EQ((*c)->generation().number, 3);
  (*c)->Listed({{0, 10}});
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ((*c)->generation().number, 3);
}

TEST(CoordinatorTest, ReportsComeOnlyFromMembersOfThisEpoch) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  const GroupKey key{"t", "j", "g", 1, "run"};
  // Nobody is a member yet.
  EXPECT_THAT((*c)->Report(Report(**c, key, 0, 1, M(0, 10), 1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not a member of generation 0")));
  ASSERT_OK((*c)->Join(M(0, 10)).status());
  WaitGeneration(**c, 1, {M(0, 10)});
  ReadyReport stale = Report(**c, key, 0, 1, M(0, 10), 1);
  stale.epoch ^= 1;
  EXPECT_THAT((*c)->Report(stale), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restarted")));
  EXPECT_THAT((*c)->Report(Report(**c, key, 0, 1, M(0, 99), 1)), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_OK((*c)->Report(Report(**c, key, 0, 1, M(0, 10), 1)));
  std::vector<LogEntry> batch = EntriesFor(ReadAll(**c, M(0, 10), 0), key);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_OK(batch[0].status);
  EXPECT_EQ(batch[0].generation, 1);
  EXPECT_EQ(batch[0].submissions, std::vector<uint64_t>{1});
}

TEST(CoordinatorTest, PlacementsNameCollectiveRanksOfTheGeneration) {
  auto c = Coordinator::Create(TestOptions(4));
  ASSERT_OK(c);
  // Ranks 1 and 3 only: collective ranks 0 and 1.
  std::vector<Member> members = {M(1, 11), M(3, 33)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  const GroupKey key{"t", "j", "g", 5, "run"};
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 2, members[1], 7)));
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 2, members[0], 8)));
  std::vector<LogEntry> batch = EntriesFor(ReadAll(**c, members[0], 0), key);
  ASSERT_EQ(batch.size(), 1u);
  ASSERT_OK(batch[0].status);
  EXPECT_EQ(batch[0].plan.fleet_world, 2);
  EXPECT_EQ(batch[0].plan.matrices[0].blocks[0].fleet_rank, 1);  // Fleet rank 3.
  EXPECT_EQ(batch[0].plan.matrices[0].blocks[1].fleet_rank, 0);  // Fleet rank 1.
  EXPECT_EQ(batch[0].submissions, (std::vector<uint64_t>{7, 8}));
}

// The coordinator holds one spec list for the reports that sent identical ones (the others keep
// their own): the verdicts and messages are still those of comparing every trainer rank's list
// with rank 0's, in rank order, whatever the order of arrival, and the plan is rank 0's list.
TEST(CoordinatorTest, SpecListsAreComparedWithRankZerosInRankOrderAndThePlanIsRankZeros) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  const std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  constexpr int kWorld = 4;
  // Two matrices, each row-sharded over the four trainer ranks; `edit` changes rank r's list.
  auto report = [&](const GroupKey& key, int r, const std::function<void(std::vector<MatrixPlan>&)>& edit) {
    ReadyReport rep = Report(**c, key, r, kWorld, members[r / 2], 100 + r);
    MatrixPlan b;
    b.name = "b";
    b.shape = {8, 2};
    b.view = Matrix2d{8, 2};
    SpecList specs = {rep.sent.spec(0), b};
    if (edit) edit(specs);
    rep.sent = SenderBlocks(std::move(specs), {Block{r, 0, 1, 4}, Block{2 * r, 0, 2, 2}});
    return rep;
  };
  auto run = [&](const GroupKey& key, const std::vector<int>& order,
                 const std::function<void(int, std::vector<MatrixPlan>&)>& edit) {
    for (int r : order) {
      EXPECT_OK((*c)->Report(report(key, r, [&](std::vector<MatrixPlan>& m) {
        if (edit) edit(r, m);
      })));
    }
    std::vector<LogEntry> entries = EntriesFor(ReadAll(**c, members[0], 0), key);
    EXPECT_EQ(entries.size(), 1u);
    return entries.empty() ? LogEntry{} : entries[0];
  };

  // Identical lists: one batch of rank 0's list, each rank's block in place.
  LogEntry ok = run(GroupKey{"t", "j", "g", 1, "run"}, {3, 1, 0, 2}, nullptr);
  ASSERT_OK(ok.status);
  ASSERT_EQ(ok.plan.matrices.size(), 2u);
  EXPECT_EQ(ok.plan.matrices[1].name, "b");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ok.plan.matrices[0].blocks[r].block, (Block{r, 0, 1, 4}));
    EXPECT_EQ(ok.plan.matrices[1].blocks[r].block, (Block{2 * r, 0, 2, 2}));
  }

  // Ranks 3 and 1 differ from rank 0, differently; rank 3 arrives first. The message names rank 1,
  // the first rank in order whose list differs from rank 0's.
  LogEntry differ = run(GroupKey{"t", "j", "g", 2, "run"}, {3, 0, 2, 1}, [](int r, std::vector<MatrixPlan>& m) {
    if (r == 3) m[0].options.steps = 7;
    if (r == 1) m[1].options.steps = 6;
  });
  EXPECT_THAT(differ.status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("step t/j/g@2: specs differ between trainer ranks 0 and 1 at matrix 1 (\"b\"): "
                                 "options.steps (5 vs 6)")));
  EXPECT_EQ(differ.failure, kStepFailureInvalid);

  // A rank with fewer matrices.
  LogEntry fewer = run(GroupKey{"t", "j", "g", 3, "run"}, {0, 1, 2, 3}, [](int r, std::vector<MatrixPlan>& m) {
    if (r == 2) m.pop_back();
  });
  EXPECT_THAT(fewer.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("trainer rank 0 sent 2 matrices but rank 2 sent 1")));

  // A field the comparison ignores (partition_dim outside the TP modes) still differs between the
  // lists: the plan carries rank 0's value, not that of the rank that arrived first.
  LogEntry ignored = run(GroupKey{"t", "j", "g", 4, "run"}, {2, 3, 1, 0}, [](int r, std::vector<MatrixPlan>& m) {
    if (r == 0) m[0].partition_dim = 1;
  });
  ASSERT_OK(ignored.status);
  EXPECT_EQ(ignored.plan.matrices[0].partition_dim, 1);
  EXPECT_EQ(ignored.plan.matrices[1].partition_dim, 0);
}

TEST(CoordinatorTest, AResultSliceOverlappingAnotherRanksSliceFailsTheStepOnEveryRankBeforeItRuns) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  const std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  const MemoryId memfd{7, 1, 42};
  // Trainer rank r's block in shared memory: its input at `in` and its result at `out` (bytes of
  // one memfd, which the two ranks may stream to different members).
  auto report = [&](const GroupKey& key, int r, int64_t in, int64_t out) {
    ReadyReport rep = Report(**c, key, r, 2, members[r], 200 + r);
    rep.region_spans = {SpanUse{SharedSpan{memfd, in, 32}, false, r, 0}, SpanUse{SharedSpan{memfd, out, 32}, true, r, 0}};
    return rep;
  };
  auto run = [&](const GroupKey& key, int64_t in0, int64_t out0, int64_t in1, int64_t out1) {
    EXPECT_OK((*c)->Report(report(key, 0, in0, out0)));
    EXPECT_OK((*c)->Report(report(key, 1, in1, out1)));
    std::vector<LogEntry> entries = EntriesFor(ReadAll(**c, members[0], 0), key);
    EXPECT_EQ(entries.size(), 1u);
    return entries.empty() ? LogEntry{} : entries[0];
  };
  // Disjoint slices: the step runs.
  ASSERT_OK(run(GroupKey{"t", "j", "g", 1, "run"}, 0, 32, 64, 96).status);
  // Inputs may be shared (both only read).
  ASSERT_OK(run(GroupKey{"t", "j", "g", 2, "run"}, 0, 32, 0, 96).status);
  // Both ranks name one result slice: the step fails, for every rank, as a batch never appended.
  LogEntry same = run(GroupKey{"t", "j", "g", 3, "run"}, 0, 64, 32, 64);
  EXPECT_THAT(same.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(HasSubstr("step t/j/g@3: trainer rank 0's result slice of matrix 0"),
                                          HasSubstr("overlaps trainer rank 1's result slice of matrix 0"),
                                          HasSubstr("nothing was written"))));
  EXPECT_EQ(same.failure, kStepFailureInvalid);
  EXPECT_TRUE(same.plan.matrices.empty());
  // Rank 1's result overlaps rank 0's input by one element.
  LogEntry into_input = run(GroupKey{"t", "j", "g", 4, "run"}, 0, 128, 64, 28);
  EXPECT_THAT(into_input.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("trainer rank 0's input slice"),
                                                HasSubstr("trainer rank 1's result slice"))));
  // The same bytes in another memory overlap nothing.
  ReadyReport other = report(GroupKey{"t", "j", "g", 5, "run"}, 1, 64, 32);
  for (SpanUse& use : other.region_spans) use.span.memory.inode = 43;
  EXPECT_OK((*c)->Report(report(GroupKey{"t", "j", "g", 5, "run"}, 0, 0, 32)));
  EXPECT_OK((*c)->Report(std::move(other)));
  std::vector<LogEntry> entries = EntriesFor(ReadAll(**c, members[0], 0), GroupKey{"t", "j", "g", 5, "run"});
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_OK(entries[0].status);
}

TEST(CoordinatorTest, ARetryReplacesItsRankWhileTheSameAttemptIsADuplicate) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  const GroupKey key{"t", "j", "g", 2, "run"};
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 3, members[0], 1)));
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 3, members[0], 2)));
  // Trainer rank 1 retries on another member (attempt 1): it replaces attempt 0.
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 3, members[1], 3, /*attempt=*/1)));
  EXPECT_EQ((*c)->pending_steps(), 1u);
  ASSERT_OK((*c)->Report(Report(**c, key, 2, 3, members[1], 4)));
  std::vector<LogEntry> batch = EntriesFor(ReadAll(**c, members[0], 0), key);
  ASSERT_EQ(batch.size(), 1u);
  ASSERT_OK(batch[0].status);
  EXPECT_EQ(batch[0].submissions, (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_EQ(batch[0].plan.matrices[0].blocks[1].fleet_rank, 1);

  const GroupKey dup{"t", "j", "g", 3, "run"};
  ASSERT_OK((*c)->Report(Report(**c, dup, 0, 2, members[0], 5, 1)));
  ASSERT_OK((*c)->Report(Report(**c, dup, 0, 2, members[1], 6, 1)));
  std::vector<LogEntry> failed = EntriesFor(ReadAll(**c, members[0], 0), dup);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(failed[0].status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate rank")));
  EXPECT_FALSE(IsFleetChange(failed[0].status));
  EXPECT_EQ(failed[0].failure, kStepFailureInvalid);
}

TEST(CoordinatorTest, RetryableAbortsWithdrawOneRankOthersAbortTheStep) {
  auto c = Coordinator::Create(TestOptions(1));
  ASSERT_OK(c);
  const Member me = M(0, 10);
  ASSERT_OK((*c)->Join(me).status());
  WaitGeneration(**c, 1, {me});
  const GroupKey key{"t", "j", "g", 1, "run"};
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 2, me, 1)));
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 2, me, 2)) );
  // (A complete step runs; use a fresh one for the aborts.)
  const GroupKey k2{"t", "j", "g", 2, "run"};
  ASSERT_OK((*c)->Report(Report(**c, k2, 0, 2, me, 3)));
  ASSERT_OK((*c)->Abort(k2, 0, absl::UnavailableError("draining"), 3, me.rank, me.incarnation));
  EXPECT_EQ((*c)->pending_steps(), 0u);
  EXPECT_TRUE(EntriesFor(ReadAll(**c, me, 0), k2).empty());
  // The retry and the other rank complete it.
  ASSERT_OK((*c)->Report(Report(**c, k2, 1, 2, me, 4)));
  ASSERT_OK((*c)->Report(Report(**c, k2, 0, 2, me, 5, 1)));
  std::vector<LogEntry> done = EntriesFor(ReadAll(**c, me, 0), k2);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_OK(done[0].status);

  const GroupKey k3{"t", "j", "g", 3, "run"};
  ASSERT_OK((*c)->Report(Report(**c, k3, 1, 2, me, 6)));
  ASSERT_OK((*c)->Abort(k3, 0, absl::CancelledError("client went away"), 0, me.rank, me.incarnation));
  std::vector<LogEntry> aborted = EntriesFor(ReadAll(**c, me, 0), k3);
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_THAT(aborted[0].status, StatusIs(absl::StatusCode::kAborted, HasSubstr("trainer rank 0 failed")));
  EXPECT_FALSE(IsFleetChange(aborted[0].status));
  EXPECT_EQ(aborted[0].failure, kStepFailureCancelled);  // The trainer's client went away.
  EXPECT_TRUE(done[0].failure.empty());
}

TEST(CoordinatorTest, ADroppedRanksReportsAreWithdrawnAndTheOthersWait) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  const GroupKey key{"t", "j", "g", 1, "run"};
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 2, members[0], 1)));
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 2, members[1], 2)) );
  const GroupKey k2{"t", "j", "g", 2, "run"};
  ASSERT_OK((*c)->Report(Report(**c, k2, 0, 2, members[0], 3)));
  ASSERT_OK((*c)->Report(Report(**c, k2, 1, 2, members[1], 4)) );
  const GroupKey k3{"t", "j", "g", 3, "run"};
  ASSERT_OK((*c)->Report(Report(**c, k3, 0, 2, members[0], 5)));
  ASSERT_OK((*c)->Report(Report(**c, k3, 1, 2, members[1], 6)) );
  const GroupKey open{"t", "j", "g", 4, "run"};
  ASSERT_OK((*c)->Report(Report(**c, open, 1, 2, members[1], 7)));
  ASSERT_OK((*c)->Leave(1, 11, (*c)->epoch()));
  // Rank 1's report is gone; the step still waits for both trainer ranks.
  EXPECT_EQ((*c)->pending_steps(), 0u);
  ASSERT_OK((*c)->Report(Report(**c, open, 0, 2, members[0], 8)));
  EXPECT_EQ((*c)->pending_steps(), 1u);
  ASSERT_OK((*c)->Report(Report(**c, open, 1, 2, members[0], 9, 1)));
  std::vector<LogEntry> done = EntriesFor(ReadAll(**c, members[0], 0), open);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_OK(done[0].status);
  EXPECT_EQ(done[0].plan.fleet_world, 1);
  EXPECT_EQ(done[0].generation, 2);
}

TEST(CoordinatorTest, RendezvousTimeoutNamesAFewRanksAndACount) {
  Coordinator::Options o = TestOptions(1);
  o.rendezvous_timeout = absl::Milliseconds(100);
  auto c = Coordinator::Create(o);
  ASSERT_OK(c);
  const Member me = M(0, 10);
  ASSERT_OK((*c)->Join(me).status());
  WaitGeneration(**c, 1, {me});
  const GroupKey key{"t", "j", "big", 1, "run"};
  ReadyReport r = Report(**c, key, 0, 4000, me, 1);
  r.sent.blocks = {Block{}};
  ASSERT_OK((*c)->Report(r));
  std::vector<LogEntry> failed;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (failed.empty() && absl::Now() < deadline) {
    failed = EntriesFor(ReadAll(**c, me, 0), key);
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(failed[0].status, StatusIs(absl::StatusCode::kAborted,
                                         HasSubstr("trainer ranks [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, "
                                                   "16, ... (and 3983 more)] of 4000 did not arrive")));
  EXPECT_LT(failed[0].status.message().size(), 512u);
  EXPECT_FALSE(IsFleetChange(failed[0].status));
  EXPECT_EQ(failed[0].failure, kStepFailureTimeout);
  EXPECT_EQ(ListText(std::vector<int64_t>{1, 2, 3}), "1, 2, 3");
}

TEST(CoordinatorTest, ARetryOfAStepThatRanIsReplayedFromWhatMembersKept) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  const GroupKey key{"t", "j", "g", 7, "run"};
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 2, members[0], 100)));
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 2, members[1], 101)));
  ASSERT_EQ(EntriesFor(ReadAll(**c, members[0], 0), key).size(), 1u);
  // Trainer rank 1 lost its result and retries on rank 0; nothing is known to be kept yet, so
  // it waits.
  ASSERT_OK((*c)->Report(Report(**c, key, 1, 2, members[0], 200, /*attempt=*/1)));
  EXPECT_EQ((*c)->pending_steps(), 1u);
  EXPECT_EQ(EntriesFor(ReadAll(**c, members[0], 0), key).size(), 1u);
  // Rank 0 says it kept trainer rank 0's step: the replay runs with that and the retry.
  ReaderState kept{0, (*c)->epoch(), 10, 0, 0, {Report(**c, key, 0, 2, members[0], 100)}};
  ASSERT_OK((*c)->Read(kept, 0, absl::Milliseconds(1)).status());
  std::vector<LogEntry> entries = EntriesFor(ReadAll(**c, members[0], 0), key);
  ASSERT_EQ(entries.size(), 2u);
  const LogEntry& replay = entries[1];
  ASSERT_OK(replay.status);
  EXPECT_EQ(replay.submissions, (std::vector<uint64_t>{100, 200}));
  EXPECT_EQ(replay.cached, (std::vector<bool>{true, false}));
  EXPECT_EQ(replay.plan.matrices[0].blocks[0].fleet_rank, 0);
  EXPECT_EQ(replay.plan.matrices[0].blocks[1].fleet_rank, 0);
  EXPECT_EQ((*c)->pending_steps(), 0u);

  // A notice that comes first makes the replay immediate; a claim for a submission the batch
  // did not use is ignored.
  const GroupKey next{"t", "j", "g", 8, "run"};
  ASSERT_OK((*c)->Report(Report(**c, next, 0, 2, members[0], 300)));
  ASSERT_OK((*c)->Report(Report(**c, next, 1, 2, members[1], 301)));
  ReaderState wrong{1, (*c)->epoch(), 11, 0, 0, {Report(**c, next, 0, 2, members[0], 300)}};  // Not rank 1's.
  ASSERT_OK((*c)->Read(wrong, 0, absl::Milliseconds(1)).status());
  ReaderState right{1, (*c)->epoch(), 11, 0, 0, {Report(**c, next, 1, 2, members[1], 301)}};
  ASSERT_OK((*c)->Read(right, 0, absl::Milliseconds(1)).status());
  ASSERT_OK((*c)->Report(Report(**c, next, 0, 2, members[1], 400, 2)));
  entries = EntriesFor(ReadAll(**c, members[0], 0), next);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[1].cached, (std::vector<bool>{false, true}));
  EXPECT_EQ(entries[1].submissions, (std::vector<uint64_t>{400, 301}));

  // A retry of an older step than the group's last cannot be run again.
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 2, members[0], 500, 3)));
  std::vector<LogEntry> old = EntriesFor(ReadAll(**c, members[0], 0), key);
  ASSERT_EQ(old.size(), 3u);
  EXPECT_THAT(old[2].status, StatusIs(absl::StatusCode::kAborted, HasSubstr("older than the last one")));
  EXPECT_EQ(old[2].failure, kStepFailureAborted);
}

// Two formed members 0 and 1 of a fresh coordinator with `o`, and the refusals it counted.
struct TwoMembers {
  std::unique_ptr<Coordinator> c;
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::shared_ptr<std::vector<std::string>> refusals = std::make_shared<std::vector<std::string>>();
};
TwoMembers StartTwo(Coordinator::Options o) {
  TwoMembers t;
  o.on_refusal = [refusals = t.refusals](const char* cause) { refusals->push_back(cause); };
  auto c = Coordinator::Create(o);
  EXPECT_OK(c.status());
  t.c = *std::move(c);
  for (const Member& m : t.members) EXPECT_OK(t.c->Join(m).status());
  WaitGeneration(*t.c, 1, t.members);
  return t;
}

GroupKey OfRun(GroupKey key, const std::string& run) {
  key.run = run;
  return key;
}

TEST(CoordinatorTest, AnotherRunsReportForAStepBeingGatheredIsRefusedAndTheFirstRunGoesOn) {
  TwoMembers t = StartTwo(TestOptions(2));
  const std::vector<std::string>& refusals = *t.refusals;
  Coordinator& c = *t.c;
  const GroupKey a{"t", "sweep", "g", 0, "run-a"};
  const GroupKey b = OfRun(a, "run-b");
  // Interleaved as two runs of one script would arrive: A0, B0, A1, B1.
  ASSERT_OK(c.Report(Report(c, a, 0, 2, t.members[0], 100)));
  ASSERT_OK(c.Report(Report(c, b, 0, 2, t.members[1], 200)));
  std::vector<LogEntry> refused = EntriesFor(ReadAll(c, t.members[0], 0), b);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_THAT(refused[0].status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                          AllOf(HasSubstr("t/sweep/g@0"), HasSubstr("run \"run-b\""),
                                                HasSubstr("run \"run-a\""), HasSubstr("never share a step"))));
  EXPECT_EQ(refused[0].failure, kStepFailureRunMismatch);
  EXPECT_FALSE(IsFleetChange(refused[0].status));
  EXPECT_EQ(refusals, (std::vector<std::string>{"run_mismatch"}));
  // A's step is untouched: its rank 1 completes it with A's two reports only.
  ASSERT_OK(c.Report(Report(c, a, 1, 2, t.members[1], 101)));
  std::vector<LogEntry> batch = EntriesFor(ReadAll(c, t.members[0], 0), a);
  ASSERT_EQ(batch.size(), 1u);
  ASSERT_OK(batch[0].status);
  EXPECT_EQ(batch[0].submissions, (std::vector<uint64_t>{100, 101}));
  // Once A's step is out of the way, B's ranks gather their own step of the same number.
  ASSERT_OK(c.Report(Report(c, b, 1, 2, t.members[1], 201)));
  ASSERT_OK(c.Report(Report(c, b, 0, 2, t.members[0], 202, /*attempt=*/1)));
  std::vector<LogEntry> own = EntriesFor(ReadAll(c, t.members[0], 0), b);
  ASSERT_EQ(own.size(), 2u);
  ASSERT_OK(own[1].status);
  EXPECT_EQ(own[1].submissions, (std::vector<uint64_t>{202, 201}));
  EXPECT_TRUE(own[1].cached.empty());
  EXPECT_EQ(c.pending_steps(), 0u);
  // A client without a run id is a run of its own ("").
  const GroupKey anonymous = OfRun(GroupKey{"t", "sweep", "g", 1, ""}, "");
  ASSERT_OK(c.Report(Report(c, OfRun(anonymous, "run-a"), 0, 2, t.members[0], 300)));
  ASSERT_OK(c.Report(Report(c, anonymous, 1, 2, t.members[1], 301)));
  std::vector<LogEntry> old = EntriesFor(ReadAll(c, t.members[0], 0), anonymous);
  ASSERT_EQ(old.size(), 1u);
  EXPECT_THAT(old[0].status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("a client that sent no run id")));
}

TEST(CoordinatorTest, ANewRunsRetryOfAnotherRunsFinishedStepIsNeverAnsweredFromItsKeptInputs) {
  TwoMembers t = StartTwo(TestOptions(2));
  Coordinator& c = *t.c;
  const GroupKey a{"t", "j", "g", 0, "run-a"};
  const GroupKey b = OfRun(a, "run-b");
  ASSERT_OK(c.Report(Report(c, a, 0, 2, t.members[0], 100)));
  ASSERT_OK(c.Report(Report(c, a, 1, 2, t.members[1], 101)));
  // Both members keep A's step.
  ASSERT_OK(c.Read(ReaderState{0, c.epoch(), 10, 0, 0, {Report(c, a, 0, 2, t.members[0], 100)}}, 0,
                   absl::Milliseconds(1))
                .status());
  ASSERT_OK(c.Read(ReaderState{1, c.epoch(), 11, 0, 0, {Report(c, a, 1, 2, t.members[1], 101)}}, 0,
                   absl::Milliseconds(1))
                .status());
  // B's rank 0 sends step 0 as a retry: it gathers B's own step, it is no replay of A's.
  ASSERT_OK(c.Report(Report(c, b, 0, 2, t.members[0], 200, /*attempt=*/1)));
  EXPECT_TRUE(EntriesFor(ReadAll(c, t.members[0], 0), b).empty());
  EXPECT_EQ(c.pending_steps(), 1u);
  ASSERT_OK(c.Report(Report(c, b, 1, 2, t.members[1], 201)));
  std::vector<LogEntry> entries = EntriesFor(ReadAll(c, t.members[0], 0), b);
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_OK(entries[0].status);
  EXPECT_EQ(entries[0].submissions, (std::vector<uint64_t>{200, 201}));
  EXPECT_TRUE(entries[0].cached.empty());
}

TEST(CoordinatorTest, AReplayNeedsTheRetrysBlocksToMatchTheKeptOriginals) {
  TwoMembers t = StartTwo(TestOptions(2));
  const std::vector<std::string>& refusals = *t.refusals;
  Coordinator& c = *t.c;
  auto with_digest = [](ReadyReport r, uint64_t digest) {
    r.digest = digest;
    return r;
  };
  const GroupKey key{"t", "j", "g", 3, "run"};
  ASSERT_OK(c.Report(with_digest(Report(c, key, 0, 2, t.members[0], 100), 0xA0)));
  ASSERT_OK(c.Report(with_digest(Report(c, key, 1, 2, t.members[1], 101), 0xA1)));
  ASSERT_OK(c.Read(ReaderState{0, c.epoch(), 10, 0, 0, {with_digest(Report(c, key, 0, 2, t.members[0], 100), 0xA0)}},
                   0, absl::Milliseconds(1))
                .status());
  ASSERT_OK(c.Read(ReaderState{1, c.epoch(), 11, 0, 0, {with_digest(Report(c, key, 1, 2, t.members[1], 101), 0xA1)}},
                   0, absl::Milliseconds(1))
                .status());
  // Trainer rank 1 retries with other blocks (its momentum moved on): no replay, an error.
  ASSERT_OK(c.Report(with_digest(Report(c, key, 1, 2, t.members[0], 200, 1), 0xB1)));
  std::vector<LogEntry> entries = EntriesFor(ReadAll(c, t.members[0], 0), key);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_THAT(entries[1].status, StatusIs(absl::StatusCode::kAborted,
                                          AllOf(HasSubstr("trainer rank 1 retries (attempt 1) with blocks other than"),
                                                HasSubstr("00000000000000b1"), HasSubstr("00000000000000a1"))));
  EXPECT_EQ(entries[1].failure, kStepFailureDigestMismatch);
  EXPECT_EQ(refusals, (std::vector<std::string>{"digest_mismatch"}));
  EXPECT_EQ(c.pending_steps(), 0u);
  // With its own blocks it is replayed from what rank 0 kept.
  ASSERT_OK(c.Report(with_digest(Report(c, key, 1, 2, t.members[0], 201, 2), 0xA1)));
  entries = EntriesFor(ReadAll(c, t.members[0], 0), key);
  ASSERT_EQ(entries.size(), 3u);
  ASSERT_OK(entries[2].status);
  EXPECT_EQ(entries[2].cached, (std::vector<bool>{true, false}));
  EXPECT_EQ(entries[2].submissions, (std::vector<uint64_t>{100, 201}));
}

TEST(CoordinatorTest, ARestartedCoordinatorLearnsAStepsDigestsFromWhatMembersKeep) {
  // This coordinator never planned step 4 (its predecessor did): member 0 keeps trainer rank 0's
  // inputs and the step's digests, and trainer rank 1, whose member died, retries.
  TwoMembers t = StartTwo(TestOptions(2));
  Coordinator& c = *t.c;
  const GroupKey key{"t", "j", "g", 4, "run"};
  ReadyReport notice = Report(c, key, 0, 2, t.members[0], 100);
  notice.digest = 0xA0;
  notice.step_digests = {0xA0, 0xA1};
  ASSERT_OK(c.Read(ReaderState{0, c.epoch(), 10, 0, 0, {notice}}, 0, absl::Milliseconds(1)).status());
  ReadyReport changed = Report(c, key, 1, 2, t.members[0], 200, 1);
  changed.digest = 0xB1;
  ASSERT_OK(c.Report(changed));
  std::vector<LogEntry> entries = EntriesFor(ReadAll(c, t.members[0], 0), key);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_THAT(entries[0].status, StatusIs(absl::StatusCode::kAborted, HasSubstr("00000000000000a1")));
  ReadyReport same = Report(c, key, 1, 2, t.members[0], 201, 2);
  same.digest = 0xA1;
  ASSERT_OK(c.Report(same));
  entries = EntriesFor(ReadAll(c, t.members[0], 0), key);
  ASSERT_EQ(entries.size(), 2u);
  ASSERT_OK(entries[1].status);
  EXPECT_EQ(entries[1].cached, (std::vector<bool>{true, false}));
  EXPECT_EQ(entries[1].digests, (std::vector<uint64_t>{0xA0, 0xA1}));
}

TEST(CoordinatorTest, ATenantsPendingStepsAreCappedAndOthersAreNot) {
  Coordinator::Options o = TestOptions(2);
  o.max_tenant_pending_steps = 2;
  TwoMembers t = StartTwo(o);
  const std::vector<std::string>& refusals = *t.refusals;
  Coordinator& c = *t.c;
  for (int step = 0; step < 2; ++step) {
    ASSERT_OK(c.Report(Report(c, GroupKey{"heavy", "j", "g", step, "run"}, 0, 2, t.members[0], 100 + step)));
  }
  // A third waiting step of the tenant is refused; another tenant's is not; a report for a
  // step already waiting is no new step.
  const GroupKey third{"heavy", "j", "g", 2, "run"};
  ASSERT_OK(c.Report(Report(c, third, 0, 2, t.members[0], 102)));
  std::vector<LogEntry> refused = EntriesFor(ReadAll(c, t.members[0], 0), third);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_THAT(refused[0].status, StatusIs(absl::StatusCode::kResourceExhausted,
                                          AllOf(HasSubstr("tenant \"heavy\" has 2 group steps waiting"),
                                                HasSubstr("--max-tenant-pending-steps = 2"))));
  EXPECT_EQ(refused[0].failure, kStepFailureLimit);
  EXPECT_EQ(refusals, (std::vector<std::string>{"limit"}));
  ASSERT_OK(c.Report(Report(c, GroupKey{"light", "j", "g", 0, "run"}, 0, 2, t.members[0], 200)));
  EXPECT_EQ(c.pending_steps(), 3u);
  // A completed step makes room.
  ASSERT_OK(c.Report(Report(c, GroupKey{"heavy", "j", "g", 0, "run"}, 1, 2, t.members[1], 300)));
  ASSERT_OK(c.Report(Report(c, third, 0, 2, t.members[0], 301, 1)));
  EXPECT_EQ(c.pending_steps(), 3u);
  EXPECT_EQ(refusals.size(), 1u);
}

TEST(CoordinatorTest, APlanTooLargeForOneLogEntryFailsItsStepAndTheNextStepRuns) {
  Coordinator::Options o = TestOptions(2);
  o.max_entry_bytes = 64 << 10;
  TwoMembers t = StartTwo(o);
  const std::vector<std::string>& refusals = *t.refusals;
  Coordinator& c = *t.c;
  auto with_matrices = [](ReadyReport r, int n) {
    SpecList specs(n, r.sent.spec(0));
    for (int i = 0; i < n; ++i) specs[i].name = absl::StrCat("layers.", i, ".weight");
    r.sent = SenderBlocks(std::move(specs), std::vector<Block>(n, r.sent.blocks[0]));
    return r;
  };
  const GroupKey big{"t", "j", "g", 1, "run"};
  ASSERT_OK(c.Report(with_matrices(Report(c, big, 0, 2, t.members[0], 100), 1000)));
  ASSERT_OK(c.Report(with_matrices(Report(c, big, 1, 2, t.members[1], 101), 1000)));
  std::vector<LogEntry> failed = EntriesFor(ReadAll(c, t.members[0], 0), big);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(failed[0].status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("1000 matrices, 2000 block placements over 2 trainer ranks"),
                             HasSubstr("more than the 65536 one log entry may hold"))));
  EXPECT_EQ(failed[0].failure, kStepFailureLimit);
  EXPECT_EQ(refusals, (std::vector<std::string>{"limit"}));
  const GroupKey small{"t", "j", "g", 2, "run"};
  ASSERT_OK(c.Report(with_matrices(Report(c, small, 0, 2, t.members[0], 200), 10)));
  ASSERT_OK(c.Report(with_matrices(Report(c, small, 1, 2, t.members[1], 201), 10)));
  std::vector<LogEntry> ran = EntriesFor(ReadAll(c, t.members[0], 0), small);
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_OK(ran[0].status);
}

TEST(CoordinatorTest, ACollectiveFailureFormsTheNextGenerationWithTheSameMembers) {
  auto c = Coordinator::Create(TestOptions(2));
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  ASSERT_OK((*c)->Read(ReaderState{1, (*c)->epoch(), 11, 0, /*failed=*/1, {}}, 0, absl::Milliseconds(1)).status());
  Generation g = WaitGeneration(**c, 2, members);
  EXPECT_EQ(g.number, 2);
  EXPECT_EQ(g.members.size(), 2u);
  EXPECT_THAT(g.members, Not(::testing::IsEmpty()));
}

// Reads as rank `m` with a formation report: generation `formed` joined, `failed` not joined or lost.
void Tell(Coordinator& c, const Member& m, int64_t formed, int64_t failed) {
  EXPECT_OK(c.Read(ReaderState{m.rank, c.epoch(), m.incarnation, formed, failed, {}}, 0, absl::Milliseconds(1)).status());
}

// Keeps `members` heartbeating for `d`.
void Heartbeat(Coordinator& c, const std::vector<Member>& members, absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (absl::Now() < until) {
    for (const Member& m : members) ReadAll(c, m, 0);
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::vector<int> Ranks(const Generation& g) {
  std::vector<int> out;
  for (const Member& m : g.members) out.push_back(m.rank);
  return out;
}

Coordinator::Options QuarantineOptions(int world) {
  Coordinator::Options o = TestOptions(world);
  o.quarantine_after = 3;
  o.quarantine_base = absl::Seconds(1);
  o.quarantine_max = absl::Seconds(4);
  return o;
}

TEST(CoordinatorTest, ARankThatKeepsFailingToJoinIsQuarantinedAndTheOthersFormWithoutIt) {
  // Ranks 1 and 2 cannot reach each other's collective port; rank 0 reaches both.
  std::vector<int> quarantined;
  Coordinator::Options options = QuarantineOptions(3);
  options.on_quarantine = [&quarantined](int rank) { quarantined.push_back(rank); };
  auto c = Coordinator::Create(options);
  ASSERT_OK(c);
  const std::vector<Member> members = {M(0, 10), M(1, 11), M(2, 12)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  Generation g = WaitGeneration(**c, 1, members);
  ASSERT_EQ(Ranks(g), (std::vector<int>{0, 1, 2}));
  // Twice the same generation again; the third failure of both ends makes a candidate of each,
  // and the higher rank goes.
  for (int round = 0; round < 3; ++round) {
    // Rank 2 first: should the reform come between the two reports, rank 2 is still the one.
    Tell(**c, members[0], g.number, 0);
    Tell(**c, members[2], 0, g.number);
    Tell(**c, members[1], 0, g.number);
    g = WaitGeneration(**c, g.number + 1, members);
    if (round < 2) {
      EXPECT_EQ(Ranks(g), (std::vector<int>{0, 1, 2})) << round;
    }
  }
  EXPECT_EQ(Ranks(g), (std::vector<int>{0, 1}));
  EXPECT_EQ((*c)->quarantined(), std::vector<int>{2});
  EXPECT_EQ(quarantined, std::vector<int>{2});
  Tell(**c, members[0], g.number, 0);
  Tell(**c, members[1], g.number, 0);
  EXPECT_TRUE((*c)->generation().formed);

  // Its first quarantine (1 s) over, it is taken back (gracefully: batches in flight finish).
  const absl::Time out = absl::Now();
  g = WaitGeneration(**c, g.number + 1, members);
  EXPECT_GE(absl::Now() - out, absl::Milliseconds(800));
  EXPECT_EQ(Ranks(g), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE((*c)->quarantined().empty());
  const std::vector<LogEntry> log = ReadAll(**c, members[0], 0);
  ASSERT_FALSE(log.empty());
  EXPECT_TRUE(log.back().membership() && log.back().graceful);

  // The partition is still there: the generation that took it back fails to form, and it goes
  // straight back out, for twice as long.
  Tell(**c, members[0], g.number, 0);
  Tell(**c, members[1], 0, g.number);
  Tell(**c, members[2], 0, g.number);
  g = WaitGeneration(**c, g.number + 1, members);
  EXPECT_EQ(Ranks(g), (std::vector<int>{0, 1}));
  EXPECT_EQ((*c)->quarantined(), std::vector<int>{2});
  EXPECT_EQ(quarantined, (std::vector<int>{2, 2}));
  Heartbeat(**c, members, absl::Milliseconds(1500));
  EXPECT_EQ((*c)->quarantined(), std::vector<int>{2}) << "the second quarantine is 2 s";
  g = WaitGeneration(**c, g.number + 1, members);
  EXPECT_EQ(Ranks(g), (std::vector<int>{0, 1, 2}));
}

TEST(CoordinatorTest, LosingAFormedCollectiveIsNoGroundForQuarantine) {
  // A member that formed its generation and then lost the collective was most likely let down by
  // a peer that died: the same members form again, as often as it happens.
  auto c = Coordinator::Create(QuarantineOptions(3));
  ASSERT_OK(c);
  const std::vector<Member> members = {M(0, 10), M(1, 11), M(2, 12)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  Generation g = WaitGeneration(**c, 1, members);
  for (int round = 0; round < 5; ++round) {
    for (const Member& m : members) Tell(**c, m, g.number, 0);
    Tell(**c, members[2], g.number, g.number);
    Tell(**c, members[1], g.number, g.number);
    g = WaitGeneration(**c, g.number + 1, members);
    EXPECT_EQ(Ranks(g), (std::vector<int>{0, 1, 2})) << round;
  }
  EXPECT_TRUE((*c)->quarantined().empty());
}

TEST(CoordinatorTest, QuarantineCanBeTurnedOffAndNeverTakesTheLastLiveRank) {
  for (int after : {0, 3}) {
    SCOPED_TRACE(after);
    Coordinator::Options options = QuarantineOptions(2);
    options.quarantine_after = after;
    auto c = Coordinator::Create(options);
    ASSERT_OK(c);
    const std::vector<Member> members = {M(0, 10), M(1, 11)};
    for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
    Generation g = WaitGeneration(**c, 1, members);
    for (int round = 0; round < 4; ++round) {
      for (const Member& m : members) Tell(**c, m, 0, g.number);
      g = WaitGeneration(**c, g.number + 1, members);
    }
    // Off: the same two, again and again. On: one of the two goes (the higher), never both.
    EXPECT_EQ(Ranks(g), after == 0 ? (std::vector<int>{0, 1}) : (std::vector<int>{0}));
    for (int round = 0; round < 4 && after > 0; ++round) {
      Tell(**c, members[0], 0, g.number);
      g = WaitGeneration(**c, g.number + 1, members);
      EXPECT_EQ(Ranks(g), std::vector<int>{0});
    }
  }
}

// A coordinator that paces batches (window 1) with `part_time`, whose first generation of
// `members` has formed.
std::unique_ptr<Coordinator> PacedAndFormed(int world, absl::Duration part_time, const std::vector<Member>& members) {
  Coordinator::Options options = TestOptions(world);
  options.batch_window = 1;
  options.part_time = part_time;
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(options);
  EXPECT_OK(c.status());
  if (!c.ok()) return nullptr;
  for (const Member& m : members) EXPECT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  for (const Member& m : members) ReadAll(**c, m, 0, /*formed=*/1);
  EXPECT_TRUE((*c)->generation().formed);
  return *std::move(c);
}

// The step keys of the batch entries in `entries`, in log order.
std::vector<std::string> BatchOrder(const std::vector<LogEntry>& entries) {
  std::vector<std::string> out;
  for (const LogEntry& e : entries) {
    if (!e.membership() && e.status.ok()) out.push_back(absl::StrCat(e.key.tenant, e.key.step));
  }
  return out;
}

// With a batch window, complete steps wait in the fair queue and go into the log one at a time,
// as rank 0 reports each batch run: a tenant's single step is not appended behind another's
// whole flood, but after at most one more of its batches (self-clocked fair queueing ties go to
// the earlier step). Waiting for its turn is no rendezvous timeout.
TEST(CoordinatorTest, PacedBatchesOfTwoTenantsInterleaveInFairOrder) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::unique_ptr<Coordinator> c = PacedAndFormed(2, absl::ZeroDuration(), members);
  ASSERT_NE(c, nullptr);

  for (int step = 1; step <= 4; ++step) {
    ASSERT_OK(c->Report(Report(*c, GroupKey{"A", "flood", "g", step, "run"}, 0, 1, members[0], 100 + step)));
  }
  ASSERT_OK(c->Report(Report(*c, GroupKey{"B", "small", "g", 1, "run"}, 0, 1, members[1], 200)));
  EXPECT_EQ(c->queued_steps(), 4u);
  EXPECT_EQ(c->pending_steps(), 4u);
  std::vector<LogEntry> log = ReadAll(*c, members[0], 0);
  EXPECT_EQ(BatchOrder(log), (std::vector<std::string>{"A1"}));
  // Rank 0 runs each batch in turn.
  for (int ran = 0; ran < 4; ++ran) {
    c->BatchRan(log.back().index);
    log = ReadAll(*c, members[0], 0);
  }
  EXPECT_EQ(BatchOrder(log), (std::vector<std::string>{"A1", "A2", "B1", "A3", "A4"}));
  EXPECT_EQ(c->queued_steps(), 0u);
  EXPECT_EQ(c->pending_steps(), 0u);
}

// The tenants' shares order the fleet's batches as they order the compute pool: a tenant of a
// higher priority class (--tenant-shares B=1:1) goes before every queued batch of a lower one.
TEST(CoordinatorTest, PacedBatchesFollowTheTenantsShares) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  Coordinator::Options options = TestOptions(2);
  options.batch_window = 1;
  options.shares["B"] = FairShare{1.0, 1};
  absl::StatusOr<std::unique_ptr<Coordinator>> created = Coordinator::Create(options);
  ASSERT_OK(created.status());
  Coordinator& c = **created;
  for (const Member& m : members) ASSERT_OK(c.Join(m).status());
  WaitGeneration(c, 1, members);
  for (const Member& m : members) ReadAll(c, m, 0, /*formed=*/1);
  ASSERT_TRUE(c.generation().formed);

  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK(c.Report(Report(c, GroupKey{"A", "flood", "g", step, "run"}, 0, 1, members[0], 100 + step)));
  }
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK(c.Report(Report(c, GroupKey{"B", "urgent", "g", step, "run"}, 0, 1, members[1], 200 + step)));
  }
  std::vector<LogEntry> log = ReadAll(c, members[0], 0);
  for (int ran = 0; ran < 5; ++ran) {
    c.BatchRan(log.back().index);
    log = ReadAll(c, members[0], 0);
  }
  // A1 went into the empty window before B's steps arrived.
  EXPECT_EQ(BatchOrder(log), (std::vector<std::string>{"A1", "B1", "B2", "B3", "A2", "A3"}));
}

// A report of `n` 4 x 4 matrices "w0".."w<n-1>" (W = 1).
ReadyReport ManyMatrices(const Coordinator& c, const GroupKey& key, const Member& fleet_rank, uint64_t submission,
                         int n) {
  ReadyReport r = Report(c, key, 0, 1, fleet_rank, submission);
  SpecList specs(n, r.sent.spec(0));
  for (int i = 0; i < n; ++i) specs[i].name = absl::StrCat("w", i);
  r.sent = SenderBlocks(std::move(specs), std::vector<Block>(n, r.sent.blocks[0]));
  return r;
}

// "<tenant><step>:<first matrix>+<matrices><more parts ? '+' : ''>" for each batch entry.
std::vector<std::string> Parts(const std::vector<LogEntry>& entries) {
  std::vector<std::string> out;
  for (const LogEntry& e : entries) {
    if (e.membership() || !e.status.ok()) continue;
    out.push_back(absl::StrCat(e.key.tenant, e.key.step, ":", e.part_offset, "+", e.plan.matrices.size(),
                               e.more_parts ? "+" : ""));
  }
  return out;
}

// With parts, a paced step of several matrices goes into the log a part at a time, the rest
// queued again after each part: another tenant's step, complete meanwhile, runs before the big
// step's last parts. Each part carries its matrices of the step's plan (names in order), says
// whether more follow, and has its AUTO owners balanced over the members. The first part is one
// matrix per member (no rate measured yet); later ones follow the measured rate (here, with
// parts of no time: one matrix per member each).
TEST(CoordinatorTest, APacedStepIsAppendedInPartsAndAnotherTenantsStepRunsBetweenThem) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::unique_ptr<Coordinator> c = PacedAndFormed(2, absl::Nanoseconds(1), members);
  ASSERT_NE(c, nullptr);

  ASSERT_OK(c->Report(ManyMatrices(*c, GroupKey{"A", "big", "g", 1, "run"}, members[0], 100, 6)));
  ASSERT_OK(c->Report(Report(*c, GroupKey{"B", "small", "g", 1, "run"}, 0, 1, members[1], 200)));
  std::vector<LogEntry> log = ReadAll(*c, members[0], 0);
  EXPECT_EQ(Parts(log), (std::vector<std::string>{"A1:0+2+"}));
  for (int ran = 0; ran < 3; ++ran) {
    c->BatchRan(log.back().index);
    log = ReadAll(*c, members[0], 0);
  }
  EXPECT_EQ(Parts(log), (std::vector<std::string>{"A1:0+2+", "B1:0+1", "A1:2+2+", "A1:4+2"}));
  std::vector<std::string> names;
  for (const LogEntry& e : EntriesFor(log, GroupKey{"A", "big", "g", 1, "run"})) {
    EXPECT_EQ(e.submissions, (std::vector<uint64_t>{100}));
    std::vector<int> owners;
    for (const MatrixPlan& m : e.plan.matrices) {
      names.push_back(m.name);
      owners.push_back(m.owner);
    }
    std::sort(owners.begin(), owners.end());
    EXPECT_EQ(owners, (std::vector<int>{0, 1})) << "part at " << e.part_offset;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"w0", "w1", "w2", "w3", "w4", "w5"}));
  EXPECT_EQ(c->queued_steps(), 0u);
}

// A paced step's matrices are estimated once for the step — its queue cost, its parts, their AUTO
// owners — not again for every part (an unchecked wire plan's estimate validates its options:
// NsOptionsValidations counts it).
TEST(CoordinatorTest, ADividedStepsMatricesAreEstimatedOnceForAllItsParts) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::unique_ptr<Coordinator> c = PacedAndFormed(2, absl::Nanoseconds(1), members);
  ASSERT_NE(c, nullptr);
  constexpr int kMatrices = 8;
  const int64_t before = NsOptionsValidations();
  ASSERT_OK(c->Report(ManyMatrices(*c, GroupKey{"A", "big", "g", 1, "run"}, members[0], 100, kMatrices)));
  std::vector<LogEntry> log = ReadAll(*c, members[0], 0);
  for (int ran = 0; ran < kMatrices / 2 - 1; ++ran) {
    c->BatchRan(log.back().index);
    log = ReadAll(*c, members[0], 0);
  }
  EXPECT_EQ(Parts(log), (std::vector<std::string>{"A1:0+2+", "A1:2+2+", "A1:4+2+", "A1:6+2"}));
  EXPECT_EQ(NsOptionsValidations() - before, kMatrices);
}

// The rest of a divided step goes ahead of its job's later steps: a job's steps run in order
// (another job's would run between the parts).
TEST(CoordinatorTest, ADividedStepsRestGoesAheadOfItsJobsLaterSteps) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::unique_ptr<Coordinator> c = PacedAndFormed(2, absl::Nanoseconds(1), members);
  ASSERT_NE(c, nullptr);
  ASSERT_OK(c->Report(ManyMatrices(*c, GroupKey{"A", "job", "g1", 1, "run"}, members[0], 100, 4)));
  ASSERT_OK(c->Report(Report(*c, GroupKey{"A", "job", "g2", 1, "run"}, 0, 1, members[1], 200)));
  std::vector<LogEntry> log = ReadAll(*c, members[0], 0);
  for (int ran = 0; ran < 2; ++ran) {
    c->BatchRan(log.back().index);
    log = ReadAll(*c, members[0], 0);
  }
  std::vector<std::string> order;
  for (const LogEntry& e : log) {
    if (!e.membership()) order.push_back(absl::StrCat(e.key.group, ":", e.part_offset));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"g1:0", "g1:2", "g2:0"}));
}

// Parts are sized by the rate rank 0's batches ran at: with a part time far above what the
// first part took, the rest of the step goes in one part.
TEST(CoordinatorTest, PartsGrowWithTheMeasuredRate) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::unique_ptr<Coordinator> c = PacedAndFormed(2, absl::Seconds(1000), members);
  ASSERT_NE(c, nullptr);
  ASSERT_OK(c->Report(ManyMatrices(*c, GroupKey{"A", "big", "g", 1, "run"}, members[0], 100, 7)));
  std::vector<LogEntry> log = ReadAll(*c, members[0], 0);
  ASSERT_EQ(Parts(log), (std::vector<std::string>{"A1:0+2+"}));
  c->BatchRan(log.back().index);
  // The rest was queued (and charged) before any rate was known: one more matrix per member,
  // then the rest.
  log = ReadAll(*c, members[0], 0);
  c->BatchRan(log.back().index);
  log = ReadAll(*c, members[0], 0);
  EXPECT_EQ(Parts(log), (std::vector<std::string>{"A1:0+2+", "A1:2+2+", "A1:4+3"}));
}

// A generation change between parts: the parts left cannot run on the old generation's
// collective, so the rest goes into the log at once, as the step's last part of the old
// generation (which its members fail as retryable).
TEST(CoordinatorTest, AGenerationChangeBetweenPartsAppendsTheRestAtOnce) {
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  std::unique_ptr<Coordinator> c = PacedAndFormed(3, absl::Nanoseconds(1), members);
  ASSERT_NE(c, nullptr);
  ASSERT_OK(c->Report(ManyMatrices(*c, GroupKey{"A", "big", "g", 1, "run"}, members[0], 100, 4)));
  ASSERT_EQ(Parts(ReadAll(*c, members[0], 0)), (std::vector<std::string>{"A1:0+2+"}));
  ASSERT_OK(c->Join(M(2, 12)).status());
  WaitGeneration(*c, 2, {members[0], members[1], M(2, 12)});
  std::vector<LogEntry> log = ReadAll(*c, members[0], 0);
  EXPECT_EQ(Parts(log), (std::vector<std::string>{"A1:0+2+", "A1:2+2"}));
  for (const LogEntry& e : EntriesFor(log, GroupKey{"A", "big", "g", 1, "run"})) EXPECT_EQ(e.generation, 1);
}

// Without rank 0 in the generation nobody reports batches run: steps go into the log as they
// complete.
TEST(CoordinatorTest, WithoutRankZeroInTheGenerationStepsAreAppendedAsTheyComplete) {
  Coordinator::Options options = TestOptions(3);
  options.batch_window = 1;
  auto c = Coordinator::Create(options);
  ASSERT_OK(c);
  std::vector<Member> members = {M(1, 11), M(2, 12)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  for (const Member& m : members) ReadAll(**c, m, 0, /*formed=*/1);
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK((*c)->Report(Report(**c, GroupKey{"A", "flood", "g", step, "run"}, 0, 1, members[0], 100 + step)));
  }
  EXPECT_EQ(BatchOrder(ReadAll(**c, members[0], 0)), (std::vector<std::string>{"A1", "A2", "A3"}));
  EXPECT_EQ((*c)->queued_steps(), 0u);
}

TEST(CoordinatorTest, AnAbortIsTakenOnlyFromAMemberAndOnlyFromTheMemberThatHoldsItsReport) {
  auto c = Coordinator::Create(TestOptions(3));
  ASSERT_OK(c);
  std::vector<Member> members = {M(0, 10), M(1, 11)};
  for (const Member& m : members) ASSERT_OK((*c)->Join(m).status());
  WaitGeneration(**c, 1, members);
  const GroupKey key{"t", "j", "g", 1, "run"};
  ASSERT_OK((*c)->Report(Report(**c, key, 0, 2, members[0], 7)));
  // Not a member: a rank that never joined, and a member's rank with another incarnation.
  EXPECT_THAT((*c)->Abort(key, 0, absl::CancelledError("x"), 7, 2, 22),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a member of generation 1")));
  EXPECT_THAT((*c)->Abort(key, 0, absl::CancelledError("x"), 7, 0, 99),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fleet rank 0 (incarnation 99)")));
  // A member aborting (or withdrawing) the report another member holds.
  EXPECT_THAT((*c)->Abort(key, 0, absl::CancelledError("x"), 7, 1, 11),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("whose report fleet rank 0 holds")));
  EXPECT_THAT((*c)->Abort(key, 0, absl::UnavailableError("x"), 7, 1, 11),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_EQ((*c)->pending_steps(), 1u);
  EXPECT_TRUE(EntriesFor(ReadAll(**c, members[0], 0), key).empty());
  // Trainer rank 1 never reported: its own member aborts it (submission 0), which ends the step.
  ASSERT_OK((*c)->Abort(key, 1, absl::CancelledError("client went away"), 0, 1, 11));
  std::vector<LogEntry> aborted = EntriesFor(ReadAll(**c, members[0], 0), key);
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_THAT(aborted[0].status, StatusIs(absl::StatusCode::kAborted, HasSubstr("trainer rank 1 failed")));
  EXPECT_EQ((*c)->pending_steps(), 0u);
  // The member that holds a report takes it back.
  const GroupKey k2{"t", "j", "g", 2, "run"};
  ASSERT_OK((*c)->Report(Report(**c, k2, 1, 2, members[1], 8)));
  ASSERT_OK((*c)->Abort(k2, 1, absl::UnavailableError("draining"), 8, 1, 11));
  EXPECT_EQ((*c)->pending_steps(), 0u);
  (*c)->Shutdown();
  EXPECT_THAT((*c)->Abort(k2, 1, absl::CancelledError("x"), 0, 1, 11),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace orthoserve
