// Failures inside a batch: a matrix that fails validation, an NS error on one rank (the owner,
// one of the gathering ranks, one TP_DISTRIBUTED participant mid-way), a missing local block —
// each reported identically on every rank while the other matrices succeed — and a broken or
// stalled collective, which fails the batch on every rank within the timeout.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/distributed/batch_harness.h"
#include "tests/util/rank_threads.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Fails every Run task of one of `shapes` with INTERNAL, and RunSharded tasks on the
// `sharded_fail_at`-th reduction (0: before the first) when set.
class FaultyBackend final : public Backend {
 public:
  FaultyBackend(Backend& inner, int rank, std::vector<Matrix2d> shapes, int sharded_fail_at = -1)
      : inner_(inner), rank_(rank), shapes_(std::move(shapes)), sharded_fail_at_(sharded_fail_at) {}

  BackendInfo Info() const override { return inner_.Info(); }

  std::vector<absl::Status> Run(absl::Span<const NsTask> tasks) override {
    std::vector<absl::Status> statuses(tasks.size());
    std::vector<NsTask> pass;
    std::vector<size_t> index;
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (std::find(shapes_.begin(), shapes_.end(), tasks[i].shape) != shapes_.end()) {
        statuses[i] = absl::InternalError(absl::StrCat("injected fault on fleet rank ", rank_));
      } else {
        pass.push_back(tasks[i]);
        index.push_back(i);
      }
    }
    std::vector<absl::Status> ran = inner_.Run(pass);
    for (size_t i = 0; i < index.size(); ++i) statuses[index[i]] = ran[i];
    return statuses;
  }

  absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer) override {
    if (sharded_fail_at_ < 0) return inner_.RunSharded(task, reducer);
    if (sharded_fail_at_ == 0) return absl::InternalError(absl::StrCat("injected fault on fleet rank ", rank_));
    CountingReducer counting(reducer, sharded_fail_at_, rank_);
    return inner_.RunSharded(task, counting);
  }

 private:
  class CountingReducer final : public SumReducer {
   public:
    CountingReducer(SumReducer& inner, int fail_at, int rank) : inner_(inner), fail_at_(fail_at), rank_(rank) {}
    absl::Status AllReduceSum(absl::Span<float> v) override { return Next() ? inner_.AllReduceSum(v) : Fault(); }
    absl::Status AllReduceSum(absl::Span<double> v) override { return Next() ? inner_.AllReduceSum(v) : Fault(); }

   private:
    bool Next() { return ++calls_ < fail_at_ + 1; }
    absl::Status Fault() const {
      return absl::InternalError(absl::StrCat("injected reduction fault on fleet rank ", rank_));
    }
    SumReducer& inner_;
    const int fail_at_;
    const int rank_;
    int calls_ = 0;
  };

  Backend& inner_;
  const int rank_;
  const std::vector<Matrix2d> shapes_;
  const int sharded_fail_at_;
};

// Forwards to a GlooCollective until its `fail_at`-th call, which destroys the Gloo group
// member (closing its connections, as a crashed rank would) and returns UNAVAILABLE.
class BreakingCollective final : public Collective {
 public:
  BreakingCollective(std::unique_ptr<Collective> inner, int fail_at)
      : inner_(std::move(inner)), rank_(inner_->rank()), world_(inner_->world()), fail_at_(fail_at) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "breaking"; }
  absl::Status AllToAllv(const void* s, absl::Span<const size_t> sb, void* r, absl::Span<const size_t> rb,
                         absl::Duration t) override {
    if (absl::Status gate = Gate(); !gate.ok()) return gate;
    return inner_->AllToAllv(s, sb, r, rb, t);
  }
  absl::Status AllGatherv(const void* s, size_t sb, void* r, absl::Span<const size_t> rb, absl::Duration t) override {
    if (absl::Status gate = Gate(); !gate.ok()) return gate;
    return inner_->AllGatherv(s, sb, r, rb, t);
  }
  absl::Status AllReduceSum(absl::Span<float> v, absl::Duration t) override {
    if (absl::Status gate = Gate(); !gate.ok()) return gate;
    return inner_->AllReduceSum(v, t);
  }
  absl::Status AllReduceSum(absl::Span<double> v, absl::Duration t) override {
    if (absl::Status gate = Gate(); !gate.ok()) return gate;
    return inner_->AllReduceSum(v, t);
  }
  absl::Status Broadcast(void* d, size_t b, int root, absl::Duration t) override {
    if (absl::Status gate = Gate(); !gate.ok()) return gate;
    return inner_->Broadcast(d, b, root, t);
  }
  absl::Status Barrier(absl::Duration t) override {
    if (absl::Status gate = Gate(); !gate.ok()) return gate;
    return inner_->Barrier(t);
  }
  void Abort(absl::string_view reason) override {
    if (inner_ != nullptr) inner_->Abort(reason);
  }

 private:
  // Counts the call; from the fail_at-th on, drops the Gloo member and fails.
  absl::Status Gate() {
    if (calls_++ < fail_at_) return absl::OkStatus();
    inner_.reset();
    return absl::UnavailableError(absl::StrCat("injected break on rank ", rank_));
  }

  std::unique_ptr<Collective> inner_;
  const int rank_;
  const int world_;
  const int fail_at_;
  int calls_ = 0;
};

MatrixSpec Spec(const std::string& name, std::vector<int64_t> shape, Algorithm algorithm, Layout layout,
                int partition_dim = 0, uint32_t seed = 1) {
  MatrixSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.algorithm = algorithm;
  spec.layout = layout;
  spec.partition_dim = partition_dim;
  spec.options.precision = Precision::kHighest;
  spec.seed = seed;
  return spec;
}

// Every rank's status of matrix `m`.
std::vector<absl::Status> StatusesOf(const std::vector<absl::StatusOr<BatchResult>>& results, size_t m) {
  std::vector<absl::Status> statuses;
  for (const absl::StatusOr<BatchResult>& r : results) {
    EXPECT_OK(r);
    if (r.ok() && m < r->matrices.size()) statuses.push_back(r->matrices[m]);
  }
  EXPECT_EQ(statuses.size(), results.size());
  return statuses;
}

void ExpectOkAndExact(const BatchPlan& plan, const BatchData& data,
                      const std::vector<absl::StatusOr<BatchResult>>& results, size_t m) {
  SCOPED_TRACE(plan.matrices[m].name);
  for (const absl::Status& s : StatusesOf(results, m)) EXPECT_OK(s);
  const std::vector<char> got = AssembleResult(plan, data, static_cast<int>(m));
  const std::vector<char> want = WholeReference(SharedCpuBackend(), plan.matrices[m], data.whole[m]);
  if (plan.matrices[m].algorithm == Algorithm::kTpDistributed) {
    EXPECT_LE(RelativeFrobenius(ToF32(plan.matrices[m].result_dtype, got), ToF32(plan.matrices[m].result_dtype, want)),
              1e-5);
  } else {
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
  }
}

// The codes a failed collective may give (collective.h): a peer gone, or the timeout.
bool IsTransportFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable || status.code() == absl::StatusCode::kDeadlineExceeded;
}

class FailureTest : public ::testing::TestWithParam<int> {};

TEST_P(FailureTest, InvalidMatrixIsSkippedOnEveryRankAndTheRestSucceed) {
  const int s = GetParam();
  const std::vector<MatrixSpec> specs = {
      Spec("a", {7, 5}, Algorithm::kAuto, Layout::kGrid),
      Spec("bad", {6, 8}, Algorithm::kRowSharded, Layout::kCols),
      Spec("t", {6, 8}, Algorithm::kTpDistributed, Layout::kRows, 0),
      Spec("g", {5, 9}, Algorithm::kGathered, Layout::kReversedRows),
      Spec("r", {9, 4}, Algorithm::kRowSharded, Layout::kRows),
  };
  const BatchPlan plan = MakePlan(s + 1, s, specs);
  BatchData data = MakeData(plan, specs);
  const std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, {&SharedCpuBackend()});
  ASSERT_EQ(results.size(), static_cast<size_t>(s));
  for (const absl::Status& st : StatusesOf(results, 1)) {
    EXPECT_THAT(
        st, StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("matrix \"bad\""), HasSubstr("expected"))));
  }
  // Its outputs were never written.
  for (const std::vector<char>& out : data.out[1]) {
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](char c) { return c == '\xff'; }));
  }
  for (size_t m : {0, 2, 3, 4}) ExpectOkAndExact(plan, data, results, m);
}

TEST_P(FailureTest, NsErrorOnOneRankReachesEveryRank) {
  const int s = GetParam();
  // "owned" fails wherever it is computed (only on its AUTO owner); "gathered" and "rows" fail
  // only on fleet rank 1 although every rank (gathered) or one owner (rows) computes them;
  // "blocks" fails for the block computed on rank 1 only.
  const std::vector<MatrixSpec> specs = {
      Spec("fine", {8, 6}, Algorithm::kAuto, Layout::kGrid),
      Spec("owned", {7, 5}, Algorithm::kAuto, Layout::kRows),
      Spec("gathered", {9, 5}, Algorithm::kGathered, Layout::kRows),
      Spec("blocks", {10, 6}, Algorithm::kTpBlockwise, Layout::kRows),
      Spec("fine_too", {4, 7}, Algorithm::kGathered, Layout::kGrid),
  };
  const int w = s;  // Trainer r on fleet rank r: the block of "blocks" on rank 1 is ChunkSizes(10, s)[1] rows.
  const BatchPlan plan = MakePlan(w, s, specs);
  BatchData data = MakeData(plan, specs);
  const Matrix2d rank1_block{plan.matrices[3].blocks[1].block.rows, 6};
  std::vector<std::unique_ptr<FaultyBackend>> backends;
  std::vector<Backend*> pointers;
  for (int r = 0; r < s; ++r) {
    std::vector<Matrix2d> shapes = {{7, 5}};
    if (r == 1) shapes.insert(shapes.end(), {{9, 5}, rank1_block});
    backends.push_back(std::make_unique<FaultyBackend>(SharedCpuBackend(), r, shapes));
    pointers.push_back(backends.back().get());
  }
  const std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, pointers);
  ASSERT_EQ(results.size(), static_cast<size_t>(s));
  const int owner = plan.matrices[1].owner;
  for (const absl::Status& st : StatusesOf(results, 1)) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kInternal,
                             AllOf(HasSubstr("matrix \"owned\""),
                                   HasSubstr(absl::StrCat("injected fault on fleet rank ", owner)))));
  }
  for (size_t m : {2, 3}) {
    for (const absl::Status& st : StatusesOf(results, m)) {
      EXPECT_THAT(st, StatusIs(absl::StatusCode::kInternal, HasSubstr("injected fault on fleet rank 1")))
          << plan.matrices[m].name;
    }
  }
  ExpectOkAndExact(plan, data, results, 0);
  ExpectOkAndExact(plan, data, results, 4);
}

TEST_P(FailureTest, TpDistributedParticipantFailureDoesNotHangOrDesync) {
  const int s = GetParam();
  for (int fail_at : {0, 1, 4}) {
    SCOPED_TRACE(absl::StrCat("fail at reduction ", fail_at));
    const std::vector<MatrixSpec> specs = {
        Spec("before", {6, 10}, Algorithm::kTpDistributed, Layout::kCols, 1, 3),
        Spec("victim", {8, 12}, Algorithm::kTpDistributed, Layout::kRows, 0, 4),
        Spec("after", {12, 8}, Algorithm::kTpDistributed, Layout::kRows, 0, 5),
        Spec("gathered", {5, 9}, Algorithm::kGathered, Layout::kGrid, 0, 6),
    };
    const BatchPlan plan = MakePlan(2 * s, s, specs);
    BatchData data = MakeData(plan, specs);
    // The last fleet rank fails its part of "victim" after `fail_at` reductions; "before" and
    // "after" run clean around it on the same collective.
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<Backend*> pointers;
    class VictimOnly final : public Backend {
     public:
      VictimOnly(Backend& inner, std::unique_ptr<Backend> faulty) : inner_(inner), faulty_(std::move(faulty)) {}
      BackendInfo Info() const override { return inner_.Info(); }
      std::vector<absl::Status> Run(absl::Span<const NsTask> tasks) override { return inner_.Run(tasks); }
      absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer) override {
        // "victim" is the only 8x12 matrix: its row shards span 12 columns (gram_size 12).
        if (task.gram_size == 12 && task.partition_dim == 0) return faulty_->RunSharded(task, reducer);
        return inner_.RunSharded(task, reducer);
      }

     private:
      Backend& inner_;
      std::unique_ptr<Backend> faulty_;
    };
    for (int r = 0; r < s; ++r) {
      if (r == s - 1) {
        backends.push_back(std::make_unique<VictimOnly>(
            SharedCpuBackend(),
            std::make_unique<FaultyBackend>(SharedCpuBackend(), r, std::vector<Matrix2d>{}, fail_at)));
      } else {
        backends.push_back(std::make_unique<FaultyBackend>(SharedCpuBackend(), r, std::vector<Matrix2d>{}));
      }
      pointers.push_back(backends.back().get());
    }
    ExecuteOptions options;
    options.collective_timeout = absl::Seconds(20);
    const absl::Time start = absl::Now();
    const std::vector<absl::StatusOr<BatchResult>> results = RunFleet(plan, data, pointers, options);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "a rank waited for a timeout";
    ASSERT_EQ(results.size(), static_cast<size_t>(s));
    for (const absl::Status& st : StatusesOf(results, 1)) {
      EXPECT_THAT(
          st, StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("matrix \"victim\""), HasSubstr(absl::StrCat("fault on fleet rank ", s - 1)))));
    }
    for (size_t m : {0, 2, 3}) ExpectOkAndExact(plan, data, results, m);
  }
}

TEST_P(FailureTest, MissingLocalBlockFailsTheMatrixOnEveryRank) {
  const int s = GetParam();
  const std::vector<MatrixSpec> specs = {
      Spec("auto", {7, 5}, Algorithm::kAuto, Layout::kGrid),
      Spec("tp", {8, 6}, Algorithm::kTpDistributed, Layout::kRows, 0),
      Spec("rows", {9, 4}, Algorithm::kRowSharded, Layout::kRows),
      Spec("whole", {5, 5}, Algorithm::kGathered, Layout::kRows),
  };
  const BatchPlan plan = MakePlan(s, s, specs);
  BatchData data = MakeData(plan, specs);
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(s);
  ASSERT_OK(group);
  std::vector<absl::StatusOr<BatchResult>> results(s, absl::UnknownError("not run"));
  RunRanks(s, [&](int rank) {
    std::vector<LocalBlock> local = LocalBlocksOf(plan, data, rank);
    if (rank == s - 1) {
      // The last rank lost its blocks of "auto" and "tp".
      local.erase(std::remove_if(local.begin(), local.end(), [](const LocalBlock& b) { return b.matrix <= 1; }),
                  local.end());
    }
    results[rank] = ExecuteBatch(plan, local, SharedCpuBackend(), *(*group)[rank], ExecuteOptions());
  });
  for (size_t m : {0, 1}) {
    for (const absl::Status& st : StatusesOf(results, m)) {
      EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr(absl::StrCat("matrix \"", plan.matrices[m].name, "\"")),
                                     HasSubstr(absl::StrCat("missing on fleet rank ", s - 1)))));
    }
  }
  ExpectOkAndExact(plan, data, results, 2);
  ExpectOkAndExact(plan, data, results, 3);
}

TEST_P(FailureTest, StalledPeerFailsTheBatchWithinTheTimeout) {
  const int s = GetParam();
  const std::vector<MatrixSpec> specs = {Spec("a", {7, 5}, Algorithm::kAuto, Layout::kRows),
                                         Spec("g", {5, 9}, Algorithm::kGathered, Layout::kGrid)};
  const BatchPlan plan = MakePlan(s, s, specs);
  BatchData data = MakeData(plan, specs);
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(s);
  ASSERT_OK(group);
  ExecuteOptions options;
  options.collective_timeout = absl::Seconds(1);
  std::vector<absl::StatusOr<BatchResult>> results(s, absl::UnknownError("not run"));
  std::vector<absl::Duration> took(s);
  RunRanks(s, [&](int rank) {
    if (rank == s - 1) return;  // Never joins (its collective stays open).
    std::vector<LocalBlock> local = LocalBlocksOf(plan, data, rank);
    const absl::Time start = absl::Now();
    results[rank] = ExecuteBatch(plan, local, SharedCpuBackend(), *(*group)[rank], options);
    took[rank] = absl::Now() - start;
  });
  for (int rank = 0; rank < s - 1; ++rank) {
    EXPECT_TRUE(IsTransportFailure(results[rank].status())) << "rank " << rank << ": " << results[rank].status();
    EXPECT_THAT(results[rank].status().message(), HasSubstr("all-to-allv"));
    EXPECT_LT(took[rank], absl::Seconds(4)) << "rank " << rank;
  }
}

TEST_P(FailureTest, BrokenCollectiveFailsTheBatchOnEveryRank) {
  const int s = GetParam();
  const std::vector<MatrixSpec> specs = {
      Spec("t", {8, 6}, Algorithm::kTpDistributed, Layout::kRows, 0),
      Spec("a", {7, 5}, Algorithm::kAuto, Layout::kRows),
  };
  // Break the last rank at its first call (the AUTO exchange), then inside the TP_DISTRIBUTED
  // reductions (calls 2 and 5: headers and payloads of the guarded reducer).
  for (int fail_at : {0, 2, 5}) {
    SCOPED_TRACE(absl::StrCat("break at call ", fail_at));
    const BatchPlan plan = MakePlan(s, s, specs);
    BatchData data = MakeData(plan, specs);
    absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(s);
    ASSERT_OK(group);
    ExecuteOptions options;
    options.collective_timeout = absl::Seconds(3);
    std::vector<absl::StatusOr<BatchResult>> results(s, absl::UnknownError("not run"));
    std::vector<absl::Duration> took(s);
    RunRanks(s, [&](int rank) {
      std::unique_ptr<Collective> collective = std::move((*group)[rank]);
      if (rank == s - 1) collective = std::make_unique<BreakingCollective>(std::move(collective), fail_at);
      std::vector<LocalBlock> local = LocalBlocksOf(plan, data, rank);
      const absl::Time start = absl::Now();
      results[rank] = ExecuteBatch(plan, local, SharedCpuBackend(), *collective, options);
      took[rank] = absl::Now() - start;
    });
    for (int rank = 0; rank < s; ++rank) {
      EXPECT_TRUE(IsTransportFailure(results[rank].status())) << "rank " << rank << ": " << results[rank].status();
      EXPECT_LT(took[rank], absl::Seconds(6)) << "rank " << rank;
    }
    EXPECT_THAT(results[s - 1], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("injected break")));
  }
}

INSTANTIATE_TEST_SUITE_P(Fleets, FailureTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return absl::StrCat("S", info.param); });

}  // namespace
}  // namespace orthoserve::testing
