// The step layer (server/step/step.h) on its own: lone and group steps driven message by message
// through a fake fleet (fake_step_fleet.h) into a recording sink — no gRPC server, no network.
// Results are compared bit for bit with the same matrix computed directly (ComputeLoneMatrix,
// what every path must end in); the engine's numerics are tests/unit/engine's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/block_digest.h"
#include "common/fleet_change.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/step/step.h"
#include "tests/unit/step/fake_step_fleet.h"
#include "tests/unit/step/recording_sink.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

// Slices of one test "region" that starts at `base`, named as the region code names them
// (RegionLease::span): the overlap checks compare these names, not addresses.
MatrixMemory InRegion(const char* base, const char* input, char* result, int64_t input_bytes, int64_t result_bytes) {
  constexpr MemoryId kRegion{1, 2, 3};
  MatrixMemory m{input, result, nullptr};
  if (input != nullptr) m.input_span = SharedSpan{kRegion, input - base, input_bytes};
  if (result != nullptr) m.result_span = SharedSpan{kRegion, result - base, result_bytes};
  return m;
}

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::orthoserve::testing::StatusIs;

std::vector<float> RandomMatrix(int64_t numel, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(numel));
  for (float& x : v) x = dist(rng);
  return v;
}

absl::string_view Bytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

class StepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *CpuBackend::Create({});
    Metrics::Options mo;
    mo.process_metrics = false;
    metrics_ = *Metrics::Create(mo);
    buffers_ = BufferPool::Create({});
  }

  StepServices Services(StepFleet* fleet) {
    StepServices s;
    s.fleet = fleet;
    s.compute = &pool_;
    s.backend = backend_.get();
    s.buffers = buffers_.get();
    s.metrics = metrics_.get();
    s.method = "StepTest";
    return s;
  }

  // OpenStep's step, or null (and a failure) when it refused.
  std::shared_ptr<Step> Open(StepFleet* fleet, StepRequest request, std::shared_ptr<StepSink> sink) {
    absl::StatusOr<std::shared_ptr<Step>> step = OpenStep(Services(fleet), std::move(request), std::move(sink));
    EXPECT_OK(step);
    return step.ok() ? *step : nullptr;
  }

  // What every path must give for `spec`'s whole matrix holding `in`.
  std::string Expected(const ParsedSpec& spec, const std::vector<float>& in) {
    std::string out(static_cast<size_t>(spec.block.numel()) * sizeof(float), '\0');
    EXPECT_OK(ComputeLoneMatrix(spec.plan, spec.block, in.data(), out.data(), *backend_, nullptr, "").status);
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<BufferPool> buffers_;
  FairPool pool_{2};
};

StepRequest Lone(int matrices) {
  StepRequest r;
  r.tenant = "t";
  r.num_matrices = matrices;
  return r;
}

TEST_F(StepTest, ALoneStepComputesEveryMatrixHereAndFinishesOk) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(2), sink);
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->lone());
  const ParsedSpec a = TestSpec("a", 8, 12), b = TestSpec("b", 16, 4);
  const std::vector<float> in_a = RandomMatrix(96, 1), in_b = RandomMatrix(64, 2);
  ASSERT_TRUE(step->AddMatrix(a, "a", {}));
  // A block arrives in any number of chunks.
  const absl::string_view bytes_a = Bytes(in_a);
  ASSERT_TRUE(step->AddData(0, {bytes_a.substr(0, 100)}));
  ASSERT_TRUE(step->AddData(0, {bytes_a.substr(100, 7), bytes_a.substr(107)}));
  ASSERT_TRUE(step->AddMatrix(b, "b", {}));
  ASSERT_TRUE(step->AddData(1, {Bytes(in_b)}));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  auto results = sink->results();
  ASSERT_THAT(results, SizeIs(2));
  EXPECT_OK(results[0].status);
  EXPECT_EQ(results[0].data, Expected(a, in_a));
  EXPECT_OK(results[1].status);
  EXPECT_EQ(results[1].data, Expected(b, in_b));
  // Each matrix was placed once, at the cost its ingress computed.
  EXPECT_EQ(fleet.costs(), (std::vector<double>{a.cost, b.cost}));
  EXPECT_EQ(fleet.peer_calls(), 0);
}

TEST_F(StepTest, ALoneMatrixGoesToThePeerTheFleetPicksAndComesBackTheSame) {
  FakeStepFleet fleet(0, 3, backend_.get());
  fleet.ForwardTo(2, /*computes=*/true);
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(1), sink);
  ASSERT_NE(step, nullptr);
  const ParsedSpec a = TestSpec("a", 12, 8);
  const std::vector<float> in = RandomMatrix(96, 3);
  ASSERT_TRUE(step->AddMatrix(a, "a", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(in)}));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  EXPECT_EQ(fleet.peer_calls(), 1);
  EXPECT_EQ(sink->results()[0].data, Expected(a, in));
}

TEST_F(StepTest, ALoneMatrixIsComputedHereWhenItsPeerIsGone) {
  FakeStepFleet fleet(0, 3, backend_.get());
  fleet.ForwardTo(1, /*computes=*/false);
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(1), sink);
  ASSERT_NE(step, nullptr);
  const ParsedSpec a = TestSpec("a", 6, 10);
  const std::vector<float> in = RandomMatrix(60, 4);
  ASSERT_TRUE(step->AddMatrix(a, "a", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(in)}));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  EXPECT_EQ(fleet.peer_calls(), 1);
  // A copy: ASSERT_OK binds a reference, which would outlive a temporary map's element.
  const auto results = sink->results();
  ASSERT_OK(results.at(0).status);
  EXPECT_EQ(results.at(0).data, Expected(a, in));
}

TEST_F(StepTest, ALoneStepAnswersBadMatricesInBandAndGoesOn) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(3), sink);
  ASSERT_NE(step, nullptr);
  // Matrix 0: a spec the ingress refused; its chunks are skipped.
  ASSERT_TRUE(step->AddMatrix(absl::InvalidArgumentError("matrix 0 (\"bad\") dtype = 42"), "bad", {4, 4}));
  ASSERT_TRUE(step->AddData(0, {"ignored"}));
  // Matrix 1: an Inf at element 5.
  const ParsedSpec b = TestSpec("b", 4, 4);
  std::vector<float> in_b = RandomMatrix(16, 5);
  in_b[5] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(step->AddMatrix(b, "b", {}));
  ASSERT_TRUE(step->AddData(1, {Bytes(in_b)}));
  // Matrix 2: good.
  const ParsedSpec c = TestSpec("c", 4, 8);
  const std::vector<float> in_c = RandomMatrix(32, 6);
  ASSERT_TRUE(step->AddMatrix(c, "c", {}));
  ASSERT_TRUE(step->AddData(2, {Bytes(in_c)}));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  auto results = sink->results();
  EXPECT_THAT(results[0].status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype = 42")));
  EXPECT_THAT(results[1].status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 1 (\"b\") data holds a non-finite value "
                                                                     "(NaN or Inf) at element 5")));
  EXPECT_OK(results[2].status);
  EXPECT_EQ(results[2].data, Expected(c, in_c));
}

TEST_F(StepTest, BadFramingFailsTheWholeStep) {
  FakeStepFleet fleet(0, 1, backend_.get());
  {  // More bytes than the block holds.
    auto sink = std::make_shared<RecordingSink>();
    std::shared_ptr<Step> step = Open(&fleet, Lone(1), sink);
  ASSERT_NE(step, nullptr);
    ASSERT_TRUE(step->AddMatrix(TestSpec("a", 2, 2), "a", {}));
    EXPECT_FALSE(step->AddData(0, {std::string(17, '\0')}));
    ASSERT_TRUE(sink->WaitFinished());
    EXPECT_THAT(sink->end().status,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("received more than its 16 bytes")));
  }
  {  // A spec beyond the header's count, and the end before a block is whole.
    auto sink = std::make_shared<RecordingSink>();
    std::shared_ptr<Step> step = Open(&fleet, Lone(1), sink);
  ASSERT_NE(step, nullptr);
    ASSERT_TRUE(step->AddMatrix(TestSpec("a", 2, 2), "a", {}));
    ASSERT_TRUE(step->AddData(0, {std::string(8, '\0')}));
    step->End();
    ASSERT_TRUE(sink->WaitFinished());
    EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("the step ended after 8 of its 16 bytes (block 2x2 of fp32)")));
  }
}

TEST_F(StepTest, ACancelledLoneStepComputesNothingMoreAndEndsCancelled) {
  FakeStepFleet fleet(0, 1, backend_.get());
  // Hold both compute threads, so that the step's matrix waits in the queue.
  absl::Notification release;
  absl::Notification held[2];
  for (auto& h : held) {
    pool_.Schedule([&release, &h] {
      h.Notify();
      release.WaitForNotification();
    });
  }
  for (auto& h : held) h.WaitForNotification();
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(2), sink);
  ASSERT_NE(step, nullptr);
  const std::vector<float> in = RandomMatrix(16, 7);
  ASSERT_TRUE(step->AddMatrix(TestSpec("a", 4, 4), "a", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(in)}));
  step->Cancel(/*draining=*/false);
  // Fed after the cancel: refused.
  EXPECT_FALSE(step->AddMatrix(TestSpec("b", 4, 4), "b", {}));
  EXPECT_FALSE(sink->finished());  // Its queued matrix is still the step's work.
  release.Notify();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  EXPECT_FALSE(IsFleetChange(sink->end().status));
  EXPECT_THAT(sink->results(), IsEmpty());
}

TEST_F(StepTest, ADrainCutsALoneStepRetryably) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(1), sink);
  ASSERT_NE(step, nullptr);
  step->Cancel(/*draining=*/true);
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
  EXPECT_TRUE(IsFleetChange(sink->end().status));
}

TEST_F(StepTest, AnAllOrNothingStepComputesNothingWhenItsLastMatrixIsBad) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  StepRequest request = Lone(3);
  request.all_or_nothing = true;
  std::shared_ptr<Step> step = Open(&fleet, request, sink);
  ASSERT_NE(step, nullptr);
  const std::vector<float> good = RandomMatrix(16, 8);
  std::vector<float> bad = RandomMatrix(16, 9);
  bad[11] = std::nanf("");
  ASSERT_TRUE(step->AddMatrix(TestSpec("a", 4, 4), "a", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(good)}));
  ASSERT_TRUE(step->AddMatrix(TestSpec("b", 4, 4), "b", {}));
  ASSERT_TRUE(step->AddData(1, {Bytes(good)}));
  ASSERT_TRUE(step->AddMatrix(TestSpec("c", 4, 4), "c", {}));
  EXPECT_FALSE(step->AddData(2, {Bytes(bad)}));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 2 (\"c\") data holds a non-finite value "
                                                                     "(NaN or Inf) at element 11")));
  // Matrices 0 and 1 were whole and finite before matrix 2 failed, and none was computed: a
  // computed matrix is handed to the sink before the step may finish.
  EXPECT_THAT(sink->results(), IsEmpty());
  EXPECT_THAT(fleet.costs(), IsEmpty());  // None was even placed.
}

TEST_F(StepTest, AnAllOrNothingStepRefusesABadSpecAsAWhole) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  StepRequest request = Lone(2);
  request.all_or_nothing = true;
  std::shared_ptr<Step> step = Open(&fleet, request, sink);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->AddMatrix(TestSpec("a", 4, 4), "a", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(RandomMatrix(16, 10))}));
  EXPECT_FALSE(step->AddMatrix(absl::InvalidArgumentError("matrix 1 (\"b\") steps = 101"), "b", {4, 4}));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps = 101")));
  EXPECT_THAT(sink->results(), IsEmpty());
}

TEST_F(StepTest, AnAllOrNothingStepComputesEveryMatrixOnceAllArrived) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  StepRequest request = Lone(2);
  request.all_or_nothing = true;
  std::shared_ptr<Step> step = Open(&fleet, request, sink);
  ASSERT_NE(step, nullptr);
  const ParsedSpec a = TestSpec("a", 4, 6), b = TestSpec("b", 6, 4);
  const std::vector<float> in_a = RandomMatrix(24, 11), in_b = RandomMatrix(24, 12);
  ASSERT_TRUE(step->AddMatrix(a, "a", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(in_a)}));
  ASSERT_TRUE(step->AddMatrix(b, "b", {}));
  ASSERT_TRUE(step->AddData(1, {Bytes(in_b)}));
  EXPECT_THAT(fleet.costs(), IsEmpty());  // Nothing is placed before the end.
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  EXPECT_EQ(sink->results()[0].data, Expected(a, in_a));
  EXPECT_EQ(sink->results()[1].data, Expected(b, in_b));
}

// Matrices whose input and/or result live in memory outside the step (a shared-memory region's
// slices, MatrixMemory): read and written in place, computed here even when the fleet would
// forward them, with the same bits as the bytes' path; the memory's owner is let go once done.
TEST_F(StepTest, MatricesInMemoryAreReadAndWrittenInPlaceAndComputedHere) {
  FakeStepFleet fleet(0, 3, backend_.get());
  fleet.ForwardTo(2, /*computes=*/true);  // Would forward a matrix in bytes.
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(3), sink);
  ASSERT_NE(step, nullptr);
  const ParsedSpec a = TestSpec("a", 8, 12), b = TestSpec("b", 6, 6), c = TestSpec("c", 4, 10);
  const std::vector<float> in_a = RandomMatrix(96, 21), in_b = RandomMatrix(36, 22), in_c = RandomMatrix(40, 23);
  std::vector<float> out_a(96, -1.0f), out_c(40, -1.0f);
  auto owner = std::make_shared<int>(0);
  std::weak_ptr<int> watch = owner;
  // a: input and result in memory; b: input in memory, result in a buffer; c: input as data, result in memory.
  ASSERT_TRUE(step->AddMatrixInMemory(a, MatrixMemory{reinterpret_cast<const char*>(in_a.data()),
                                                      reinterpret_cast<char*>(out_a.data()), owner}));
  ASSERT_TRUE(step->AddMatrixInMemory(b, MatrixMemory{reinterpret_cast<const char*>(in_b.data()), nullptr, owner}));
  ASSERT_TRUE(step->AddMatrixInMemory(c, MatrixMemory{nullptr, reinterpret_cast<char*>(out_c.data()), owner}));
  ASSERT_TRUE(step->AddData(2, {Bytes(in_c)}));
  owner.reset();
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  auto results = sink->results();
  ASSERT_THAT(results, SizeIs(3));
  for (const auto& [index, r] : results) {
    SCOPED_TRACE(index);
    EXPECT_OK(r.status);
  }
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out_a.data()), 96 * sizeof(float)), Expected(a, in_a));
  EXPECT_EQ(results[0].data, Expected(a, in_a));  // The sink is handed the result where it was written.
  EXPECT_EQ(results[1].data, Expected(b, in_b));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out_c.data()), 40 * sizeof(float)), Expected(c, in_c));
  EXPECT_EQ(fleet.peer_calls(), 0);
  step.reset();
  EXPECT_TRUE(watch.expired());  // Nobody holds the memory's owner any more (the regions' leases).
}

TEST_F(StepTest, ANonFiniteValueInMemoryIsRefusedLikeOneInBytes) {
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  StepRequest request = Lone(1);
  request.all_or_nothing = true;
  std::shared_ptr<Step> step = Open(&fleet, request, sink);
  ASSERT_NE(step, nullptr);
  std::vector<float> in = RandomMatrix(16, 24);
  in[5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(step->AddMatrixInMemory(TestSpec("a", 4, 4), MatrixMemory{reinterpret_cast<const char*>(in.data()),
                                                                        nullptr, nullptr}));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element 5")));
}

// In a stream step (not all or nothing) on a backend that fails non-finite input (the CPU
// backend), a block in memory is not scanned on arrival: the computation's own pass finds a NaN or
// Inf, and the step then answers it in-band with the element, as the scan on arrival would, with
// nothing written to its result slice; finite blocks are computed without a scan of their own.
TEST_F(StepTest, ANonFiniteValueInMemoryOfAStreamIsFoundByTheComputationAndAnsweredInBand) {
  ASSERT_TRUE(backend_->FailsNonFiniteInput());
  FakeStepFleet fleet(0, 1, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Lone(3), sink);
  ASSERT_NE(step, nullptr);
  ParsedSpec a = TestSpec("a", 4, 6), b = TestSpec("b", 6, 8), c = TestSpec("c", 8, 4);
  b.plan.options.steps = 0;  // The elementwise path.
  std::vector<float> in_a = RandomMatrix(24, 31), in_b = RandomMatrix(48, 32);
  const std::vector<float> in_c = RandomMatrix(32, 33);
  in_a[7] = std::numeric_limits<float>::quiet_NaN();
  in_b[30] = -std::numeric_limits<float>::infinity();
  std::vector<float> out_a(24, -1.0f), out_b(48, -1.0f), out_c(32, -1.0f);
  const int64_t scanned = NonFiniteScannedElements();
  ASSERT_TRUE(step->AddMatrixInMemory(a, MatrixMemory{reinterpret_cast<const char*>(in_a.data()),
                                                      reinterpret_cast<char*>(out_a.data()), nullptr}));
  ASSERT_TRUE(step->AddMatrixInMemory(b, MatrixMemory{reinterpret_cast<const char*>(in_b.data()),
                                                      reinterpret_cast<char*>(out_b.data()), nullptr}));
  ASSERT_TRUE(step->AddMatrixInMemory(c, MatrixMemory{reinterpret_cast<const char*>(in_c.data()),
                                                      reinterpret_cast<char*>(out_c.data()), nullptr}));
  step->End();
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  auto results = sink->results();
  ASSERT_THAT(results, SizeIs(3));
  EXPECT_THAT(results[0].status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 0 (\"a\") data holds a non-finite value "
                                                                     "(NaN or Inf) at element 7 of its block")));
  EXPECT_THAT(results[1].status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matrix 1 (\"b\") data holds a non-finite value "
                                                                     "(NaN or Inf) at element 30 of its block")));
  EXPECT_EQ(out_a, std::vector<float>(24, -1.0f));
  EXPECT_EQ(out_b, std::vector<float>(48, -1.0f));
  EXPECT_OK(results[2].status);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out_c.data()), 32 * sizeof(float)), Expected(c, in_c));
  // Only the two failed blocks were scanned, after their computation failed.
  EXPECT_EQ(NonFiniteScannedElements() - scanned, 24 + 48);
}

// A slice written by one matrix of a step that overlaps a slice of another (its input, or its
// result) fails the step when the later one arrives, even when the earlier one is computed
// already: the step may compute them in any order, so one of them would get a result that is not
// its own. Inputs over inputs are fine.
TEST_F(StepTest, SlicesOfOneStepThatOverlapWhereOneIsWrittenFailTheStep) {
  struct Case {
    const char* name;
    int b_input_at;   // Float offsets in one "region" of 64 floats; -1: none.
    int b_result_at;
    const char* error;  // Empty: the step is served.
  };
  // a: input at [0, 16), result at [16, 32); b is 4x4 too.
  for (const Case& c :
       {Case{"b's result over a's input", -1, 8, "result_region overlaps the input_region of matrix 0"},
        Case{"b's input over a's result", 20, -1, "input_region overlaps the result_region of matrix 0"},
        Case{"b's result over a's result", -1, 31, "result_region overlaps the result_region of matrix 0"},
        Case{"b's input on a's input, result apart", 0, 32, ""}, Case{"side by side", 32, 48, ""}}) {
    SCOPED_TRACE(c.name);
    FakeStepFleet fleet(0, 1, backend_.get());
    auto sink = std::make_shared<RecordingSink>();
    std::shared_ptr<Step> step = Open(&fleet, Lone(2), sink);
    ASSERT_NE(step, nullptr);
    std::vector<float> region = RandomMatrix(64, 31);
    char* base = reinterpret_cast<char*>(region.data());
    constexpr int64_t k16 = 16 * sizeof(float);
    ASSERT_TRUE(step->AddMatrixInMemory(TestSpec("a", 4, 4), InRegion(base, base, base + k16, k16, k16)));
    // a is computed (and lets go of its leases) before b arrives: its slices still count.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (sink->results().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_THAT(sink->results(), SizeIs(1));
    const std::vector<float> b_bytes = RandomMatrix(16, 32);
    const MatrixMemory b = InRegion(base, c.b_input_at < 0 ? nullptr : base + c.b_input_at * sizeof(float),
                                    c.b_result_at < 0 ? nullptr : base + c.b_result_at * sizeof(float), k16, k16);
    const bool taken = step->AddMatrixInMemory(TestSpec("b", 4, 4), b);
    if (*c.error != '\0') {
      EXPECT_FALSE(taken);
      ASSERT_TRUE(sink->WaitFinished());
      EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
      continue;
    }
    ASSERT_TRUE(taken);
    if (c.b_input_at < 0) {
      ASSERT_TRUE(step->AddData(1, {Bytes(b_bytes)}));
    }
    step->End();
    ASSERT_TRUE(sink->WaitFinished());
    EXPECT_OK(sink->end().status);
  }
}

// A group step (W = 2, this is trainer rank 1) holding the bottom half of a 4x6 matrix.
class GroupStepTest : public StepTest {
 protected:
  StepRequest Group() {
    StepRequest r;
    r.tenant = "t";
    r.job = "j";
    r.group = "g";
    r.step = 7;
    r.rank = 1;
    r.world = 2;
    r.attempt = 0;
    r.num_matrices = 1;
    r.run = "run-1";
    return r;
  }
  ParsedSpec Half() { return TestSpec("w", 4, 6, Block{2, 0, 2, 6}); }
};

// Blocks in memory outside the step (a trainer's shared-memory slices) go to the fleet where
// they are: the submitted step reads its input there (digested like bytes) and has its result
// written there; a block in bytes beside them keeps its buffers. The sink gets the result where
// it was written, and the memory's owner is let go once the step and the fleet are done.
TEST_F(GroupStepTest, BlocksInMemoryGoToTheFleetInPlaceBesideBlocksInBytes) {
  auto fleet = std::make_unique<FakeStepFleet>(0, 2, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  StepRequest request = Group();
  request.num_matrices = 3;
  std::shared_ptr<Step> step = Open(fleet.get(), request, sink);
  ASSERT_NE(step, nullptr);
  const std::vector<float> in_a = RandomMatrix(12, 31), in_b = RandomMatrix(12, 32), in_c = RandomMatrix(12, 33);
  std::vector<float> out_a(12, -1.0f), out_c(12, -1.0f);
  auto owner = std::make_shared<int>(0);
  std::weak_ptr<int> watch = owner;
  const ParsedSpec a = TestSpec("a", 4, 6, Block{2, 0, 2, 6}), b = TestSpec("b", 4, 6, Block{2, 0, 2, 6}),
                   c = TestSpec("c", 4, 6, Block{2, 0, 2, 6});
  // a: input and result in memory; b: bytes; c: input as data, result in memory.
  ASSERT_TRUE(step->AddMatrixInMemory(a, MatrixMemory{reinterpret_cast<const char*>(in_a.data()),
                                                      reinterpret_cast<char*>(out_a.data()), owner}));
  ASSERT_TRUE(step->AddMatrix(b, "b", {}));
  ASSERT_TRUE(step->AddData(1, {Bytes(in_b)}));
  ASSERT_TRUE(step->AddMatrixInMemory(c, MatrixMemory{nullptr, reinterpret_cast<char*>(out_c.data()), owner}));
  ASSERT_TRUE(step->AddData(2, {Bytes(in_c)}));
  owner.reset();
  step->End();
  ASSERT_THAT(fleet->submitted(), SizeIs(1));
  FakeStepFleet::Submitted s = fleet->submitted()[0];
  TrainerStep& t = *s.step;
  ASSERT_THAT(t.input_at, SizeIs(3));
  ASSERT_THAT(t.output_at, SizeIs(3));
  EXPECT_EQ(t.input_at[0], reinterpret_cast<const char*>(in_a.data()));  // Not copied.
  EXPECT_THAT(t.inputs[0], IsEmpty());
  EXPECT_EQ(t.input_at[1], nullptr);
  EXPECT_EQ(t.input_at[2], nullptr);
  EXPECT_EQ(t.input(1), Bytes(in_b));
  EXPECT_EQ(t.input(2), Bytes(in_c));
  EXPECT_EQ(t.output_at[0], reinterpret_cast<char*>(out_a.data()));
  EXPECT_EQ(t.output_at[1], nullptr);
  EXPECT_EQ(t.output_at[2], reinterpret_cast<char*>(out_c.data()));
  // The digest covers the block read in place as it covers bytes.
  std::vector<DigestedBlock> digested;
  for (const std::vector<float>* in : {&in_a, &in_b, &in_c}) {
    StreamDigest bytes;
    bytes.Update(Bytes(*in));
    digested.push_back(DigestedBlock{Block{2, 0, 2, 6}, DType::kF32, bytes.Value()});
  }
  EXPECT_EQ(t.digest, StepDigest(digested));
  EXPECT_FALSE(watch.expired());  // The fleet's step holds the memory until its batch ran.

  // The batch ran: it wrote a's and c's results into the memory, b's into the step's outputs.
  std::fill(out_a.begin(), out_a.end(), 1.5f);
  std::fill(out_c.begin(), out_c.end(), 2.5f);
  t.outputs = {{}, std::vector<char>(48, 'x'), {}};
  StepOutcome outcome;
  outcome.matrices = {absl::OkStatus(), absl::OkStatus(), absl::OkStatus()};
  EXPECT_TRUE(TakeRegionInputs(t));  // As the fleet does before it keeps the step.
  EXPECT_EQ(std::string(t.inputs[0].begin(), t.inputs[0].end()), std::string(Bytes(in_a)));
  s.done(std::move(outcome));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  auto results = sink->results();
  ASSERT_THAT(results, SizeIs(3));
  EXPECT_EQ(results[0].data, std::string(Bytes(out_a)));
  EXPECT_EQ(results[1].data, std::string(48, 'x'));
  EXPECT_EQ(results[2].data, std::string(Bytes(out_c)));
  s = FakeStepFleet::Submitted{};
  step.reset();
  fleet.reset();  // Its record of the submission (the fleet's step) goes too.
  EXPECT_TRUE(watch.expired());  // Nobody holds the memory's owner any more.
}

// A result slice that overlaps another matrix's input slice fails the group step as it arrives,
// before the fleet has it (the batch may write the one before it reads the other), and the other
// ranks are told; slices side by side do not.
TEST_F(GroupStepTest, AResultSliceOverlappingAnotherMatricesInputFailsTheStep) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap);
    FakeStepFleet fleet(0, 2, backend_.get());
    auto sink = std::make_shared<RecordingSink>();
    StepRequest request = Group();
    request.num_matrices = 2;
    std::shared_ptr<Step> step = Open(&fleet, request, sink);
    ASSERT_NE(step, nullptr);
    // One "region": a's input at 0, b's input after it, b's result over a's input's second half or after both.
    std::vector<float> region = RandomMatrix(48, 34);
    const char* base = reinterpret_cast<const char*>(region.data());
    char* b_result = reinterpret_cast<char*>(region.data()) + (overlap ? 6 : 24) * sizeof(float);
    constexpr int64_t k12 = 12 * sizeof(float);
    ASSERT_TRUE(step->AddMatrixInMemory(TestSpec("a", 4, 6, Block{2, 0, 2, 6}), InRegion(base, base, nullptr, k12, 0)));
    const bool taken = step->AddMatrixInMemory(TestSpec("b", 4, 6, Block{2, 0, 2, 6}),
                                               InRegion(base, base + k12, b_result, k12, k12));
    if (overlap) {
      EXPECT_FALSE(taken);
      ASSERT_TRUE(sink->WaitFinished());
      EXPECT_THAT(sink->end().status,
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps the input_region of matrix 0")));
      EXPECT_THAT(fleet.submitted(), IsEmpty());
      EXPECT_THAT(fleet.aborts(), SizeIs(1));  // The other ranks are told.
    } else {
      ASSERT_TRUE(taken);
      step->End();
      EXPECT_THAT(fleet.submitted(), SizeIs(1));
      EXPECT_FALSE(sink->finished());
    }
  }
}

// Device memory (a CUDA IPC region) is not served in group steps: the step fails, and the other
// ranks are told.
TEST_F(GroupStepTest, DeviceMemoryFailsTheGroupStep) {
  FakeStepFleet fleet(0, 2, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Group(), sink);
  ASSERT_NE(step, nullptr);
  const std::vector<float> in = RandomMatrix(12, 25);
  MatrixMemory memory{reinterpret_cast<const char*>(in.data()), nullptr, nullptr};
  memory.input_space = MemorySpace::kDevice;
  EXPECT_FALSE(step->AddMatrixInMemory(Half(), memory));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("group steps")));
  EXPECT_THAT(fleet.submitted(), IsEmpty());
  EXPECT_THAT(fleet.aborts(), SizeIs(1));
}

// A block whose input in memory holds NaN fails the group step like one in bytes.
TEST_F(GroupStepTest, ANonFiniteValueInMemoryFailsTheGroupStep) {
  FakeStepFleet fleet(0, 2, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Group(), sink);
  ASSERT_NE(step, nullptr);
  std::vector<float> in = RandomMatrix(12, 26);
  in[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(
      step->AddMatrixInMemory(Half(), MatrixMemory{reinterpret_cast<const char*>(in.data()), nullptr, nullptr}));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element 4")));
  EXPECT_THAT(fleet.submitted(), IsEmpty());
}

TEST_F(GroupStepTest, OnARankThatIsNotReadyItIsUnavailable) {
  FakeStepFleet fleet(0, 2, backend_.get());
  fleet.set_ready(false);
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_THAT(OpenStep(Services(&fleet), Group(), sink),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not a member of a formed fleet generation")));
}

TEST_F(GroupStepTest, ItIsSubmittedWithItsBlockOnceWholeAndDeliversTheFleetsResult) {
  FakeStepFleet fleet(3, 4, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Group(), sink);
  ASSERT_NE(step, nullptr);
  EXPECT_FALSE(step->lone());
  const std::vector<float> in = RandomMatrix(12, 13);
  ASSERT_TRUE(step->AddMatrix(Half(), "w", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(in).substr(0, 20)}));
  EXPECT_THAT(fleet.submitted(), IsEmpty());
  ASSERT_TRUE(step->AddData(0, {Bytes(in).substr(20)}));
  step->End();
  ASSERT_THAT(fleet.submitted(), SizeIs(1));
  FakeStepFleet::Submitted s = fleet.submitted()[0];
  const TrainerStep& t = *s.step;
  EXPECT_EQ(t.key, (GroupKey{"t", "j", "g", 7, "run-1"}));
  EXPECT_EQ(t.trainer_rank, 1);
  EXPECT_EQ(t.trainer_world, 2);
  // Its block of the step's spec, which carries no placement (the block travels beside it).
  ASSERT_EQ(t.sent.size(), 1u);
  ASSERT_EQ(t.sent.specs->size(), 1u);
  EXPECT_EQ(t.sent.spec(0).name, "w");
  EXPECT_THAT(t.sent.spec(0).blocks, IsEmpty());
  EXPECT_EQ(t.sent.blocks[0], (Block{2, 0, 2, 6}));
  EXPECT_EQ(std::string(t.inputs[0].begin(), t.inputs[0].end()), std::string(Bytes(in)));
  // The digest of what arrived, for the coordinator's retry checks.
  StreamDigest bytes;
  bytes.Update(Bytes(in));
  const DigestedBlock digested{Block{2, 0, 2, 6}, DType::kF32, bytes.Value()};
  EXPECT_EQ(t.digest, StepDigest(absl::MakeConstSpan(&digested, 1)));
  EXPECT_FALSE(sink->finished());  // Waiting for its batch.

  // The batch ran: the fleet filled the output block.
  s.step->outputs = {std::vector<char>(48, 'x')};
  StepOutcome outcome;
  outcome.matrices = {absl::OkStatus()};
  s.done(std::move(outcome));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_OK(sink->end().status);
  EXPECT_EQ(sink->results()[0].data, std::string(48, 'x'));
  EXPECT_EQ(sink->results()[0].block, (Block{2, 0, 2, 6}));
  EXPECT_THAT(fleet.aborts(), IsEmpty());
}

TEST_F(GroupStepTest, BadInputFailsTheStepAndTellsTheOtherRanks) {
  FakeStepFleet fleet(0, 2, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Group(), sink);
  ASSERT_NE(step, nullptr);
  std::vector<float> in = RandomMatrix(12, 14);
  in[3] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(step->AddMatrix(Half(), "w", {}));
  EXPECT_FALSE(step->AddData(0, {Bytes(in)}));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
  EXPECT_THAT(fleet.submitted(), IsEmpty());
  ASSERT_THAT(fleet.aborts(), SizeIs(1));
  EXPECT_EQ(fleet.aborts()[0].key, (GroupKey{"t", "j", "g", 7, "run-1"}));
  EXPECT_EQ(fleet.aborts()[0].trainer_rank, 1);
  EXPECT_EQ(fleet.aborts()[0].submission, 0u);  // Not submitted yet.
  EXPECT_THAT(fleet.aborts()[0].reason, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST_F(GroupStepTest, ACancelWhileItWaitsEndsItAtOnceAndWithdrawsItsSubmission) {
  FakeStepFleet fleet(0, 2, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Group(), sink);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->AddMatrix(Half(), "w", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(RandomMatrix(12, 15))}));
  step->End();
  ASSERT_THAT(fleet.submitted(), SizeIs(1));
  const uint64_t submission = fleet.submitted()[0].step->submission;
  step->Cancel(/*draining=*/false);
  ASSERT_TRUE(sink->WaitFinished(absl::Seconds(1)));
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  ASSERT_THAT(fleet.aborts(), SizeIs(1));
  EXPECT_EQ(fleet.aborts()[0].submission, submission);
  // The fleet's late outcome changes nothing (the sink fails the test on a second Finished).
  StepOutcome late;
  late.status = absl::AbortedError("withdrawn");
  fleet.submitted()[0].done(std::move(late));
  EXPECT_THAT(sink->results(), IsEmpty());
}

TEST_F(GroupStepTest, AFailedBatchFailsTheStepRetryablyWhenTheFleetSaysSo) {
  FakeStepFleet fleet(0, 2, backend_.get());
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Step> step = Open(&fleet, Group(), sink);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->AddMatrix(Half(), "w", {}));
  ASSERT_TRUE(step->AddData(0, {Bytes(RandomMatrix(12, 16))}));
  step->End();
  ASSERT_THAT(fleet.submitted(), SizeIs(1));
  StepOutcome outcome;
  outcome.status = MarkFleetChange(absl::UnavailableError("the generation changed"));
  fleet.submitted()[0].done(std::move(outcome));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_THAT(sink->end().status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("generation changed")));
  EXPECT_TRUE(IsFleetChange(sink->end().status));
}

}  // namespace
}  // namespace orthoserve
