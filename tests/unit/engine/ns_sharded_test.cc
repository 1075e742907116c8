// TP_DISTRIBUTED on the CPU backend: a matrix split into 1..4 contiguous shards along dim 0 or
// dim 1, each participant in its own thread joined by an in-test SumReducer, agrees with the
// single-matrix NS (same forced orientation) within the precision's tolerance.
#include <condition_variable>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/newton_schulz.h"
#include "tests/unit/engine/engine_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::Combine;
using ::testing::Values;

// Sums over `world` participant threads: each call deposits a copy, waits for all, and every
// participant adds the deposits in participant order (so all get the same bits).
class ThreadSumReducer {
 public:
  explicit ThreadSumReducer(int world) : world_(world), deposits_(world) {}

  class Participant : public SumReducer {
   public:
    Participant(ThreadSumReducer* parent, int rank) : parent_(parent), rank_(rank) {}
    absl::Status AllReduceSum(absl::Span<float> values) override { return parent_->Reduce(rank_, values); }
    absl::Status AllReduceSum(absl::Span<double> values) override { return parent_->Reduce(rank_, values); }

   private:
    ThreadSumReducer* parent_;
    int rank_;
  };

  template <typename T>
  absl::Status Reduce(int rank, absl::Span<T> values) {
    deposits_[rank].assign(values.begin(), values.end());
    Barrier();
    for (size_t i = 0; i < values.size(); ++i) {
      T sum = 0;
      for (int r = 0; r < world_; ++r) {
        if (deposits_[r].size() != values.size()) return absl::InternalError("participants reduce different sizes");
        sum += static_cast<T>(deposits_[r][i]);
      }
      values[i] = sum;
    }
    Barrier();  // Nobody deposits the next reduction before everyone has read this one.
    return absl::OkStatus();
  }

 private:
  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

  const int world_;
  std::vector<std::vector<double>> deposits_;  // Floats are carried exactly in doubles.
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

// Splits `g` (rows × cols) into `count` contiguous slices along `dim`, uneven on purpose.
std::vector<std::tuple<int64_t, int64_t, std::vector<double>>> Split(const std::vector<double>& g, int64_t rows,
                                                                     int64_t cols, int dim, int count) {
  const int64_t extent = dim == 0 ? rows : cols;
  std::vector<int64_t> bounds = {0};
  for (int i = 1; i < count; ++i) bounds.push_back(extent * i / count + (i % 2));
  bounds.push_back(extent);
  std::vector<std::tuple<int64_t, int64_t, std::vector<double>>> slices;
  for (int i = 0; i < count; ++i) {
    const int64_t r0 = dim == 0 ? bounds[i] : 0, r1 = dim == 0 ? bounds[i + 1] : rows;
    const int64_t c0 = dim == 1 ? bounds[i] : 0, c1 = dim == 1 ? bounds[i + 1] : cols;
    std::vector<double> s;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) s.push_back(g[r * cols + c]);
    }
    slices.emplace_back(r1 - r0, c1 - c0, std::move(s));
  }
  return slices;
}

// Joins slices back along `dim`.
std::vector<double> Join(const std::vector<std::tuple<int64_t, int64_t, std::vector<double>>>& slices, int64_t rows,
                         int64_t cols, int dim) {
  std::vector<double> g(rows * cols);
  int64_t offset = 0;
  for (const auto& [r, c, data] : slices) {
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        g[(dim == 0 ? offset + i : i) * cols + (dim == 1 ? offset + j : j)] = data[i * c + j];
      }
    }
    offset += dim == 0 ? r : c;
  }
  return g;
}

// Runs OrthogonalizeSharded with `participants` threads; participant p holds the slices in
// `owned[p]` (possibly none). Returns the joined result.
std::vector<double> RunSharded(const std::vector<double>& g, int64_t rows, int64_t cols, int dim, int slices_count,
                               const std::vector<std::vector<int>>& owned, const NsOptions& options, DType dtype) {
  auto slices = Split(g, rows, cols, dim, slices_count);
  std::vector<std::vector<char>> ins, outs;
  for (const auto& [r, c, data] : slices) {
    ins.push_back(Pack(data, dtype));
    outs.emplace_back(static_cast<size_t>(r * c) * ElementSize(dtype), 0);
  }
  const int world = static_cast<int>(owned.size());
  ThreadSumReducer reducer(world);
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int p = 0; p < world; ++p) {
    threads.emplace_back([&, p] {
      std::vector<NsShard> shards;
      for (int s : owned[p]) {
        const auto& [r, c, data] = slices[s];
        shards.push_back(NsShard{{r, c}, dtype, ins[s].data(), dtype, outs[s].data()});
      }
      ThreadSumReducer::Participant participant(&reducer, p);
      statuses[p] =
          OrthogonalizeSharded(CpuBackendWithThreads(1), "g", {rows, cols}, dim, options, shards, participant);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) EXPECT_OK(s);
  for (size_t s = 0; s < slices.size(); ++s) std::get<2>(slices[s]) = Unpack(outs[s], dtype);
  return Join(slices, rows, cols, dim);
}

// One participant per slice.
std::vector<std::vector<int>> OnePerParticipant(int count) {
  std::vector<std::vector<int>> owned(count);
  for (int i = 0; i < count; ++i) owned[i] = {i};
  return owned;
}

NsOptions Forced(NsOptions o, int dim) {
  o.transpose = dim == 0 ? TransposeMode::kOn : TransposeMode::kOff;
  return o;
}

class ShardedTest : public ::testing::TestWithParam<std::tuple<int, int, Precision>> {};

TEST_P(ShardedTest, AgreesWithSingleMatrixNs) {
  const auto [dim, count, precision] = GetParam();
  NsOptions o;
  o.precision = precision;
  // The sharded dim is the long one: rows for dim 0, cols for dim 1.
  const int64_t rows = dim == 0 ? 60 : 20, cols = dim == 0 ? 20 : 60;
  std::vector<double> g = RandomMatrix(rows, cols, 40 + dim * 10 + count);
  std::vector<double> sharded = RunSharded(g, rows, cols, dim, count, OnePerParticipant(count), o, DType::kF32);
  NsRun single = RunNs(CpuBackendWithThreads(1), g, rows, cols, Forced(o, dim));
  ASSERT_OK(single.status);
  EXPECT_LE(RelativeError(sharded, single.values), precision == Precision::kMedium ? 2e-2 : kHighestTolerance);
  // And against the reference of the same orientation.
  EXPECT_LE(RelativeError(sharded, Reference(g, rows, cols, Forced(o, dim))),
            precision == Precision::kMedium ? 2e-2 : kHighestTolerance);
}

INSTANTIATE_TEST_SUITE_P(Splits, ShardedTest,
                         Combine(Values(0, 1), Values(1, 2, 3, 4), Values(Precision::kHighest, Precision::kMedium)));

TEST(ShardedTest, OneShardIsBitIdenticalToSingleMatrixNs) {
  for (Precision precision : {Precision::kHighest, Precision::kMedium}) {
    for (int dim : {0, 1}) {
      NsOptions o;
      o.precision = precision;
      std::vector<double> g = RandomMatrix(24, 24, 50 + dim);
      std::vector<double> sharded = RunSharded(g, 24, 24, dim, 1, {{0}}, o, DType::kBF16);
      NsRun single = RunNs(CpuBackendWithThreads(1), g, 24, 24, Forced(o, dim), DType::kBF16, DType::kBF16);
      ASSERT_OK(single.status);
      EXPECT_EQ(sharded, single.values) << "dim " << dim;
    }
  }
}

TEST(ShardedTest, ParticipantsWithSeveralOrNoShards) {
  NsOptions o;
  o.precision = Precision::kHighest;
  o.coefficients = CoefficientType::kCubic5;  // c = 0 on every step.
  std::vector<double> g = RandomMatrix(16, 48, 60);
  // Four slices over three participants: one holds two, one holds none.
  std::vector<double> sharded = RunSharded(g, 16, 48, 1, 4, {{0, 2}, {}, {1, 3}}, o, DType::kF32);
  NsRun single = RunNs(CpuBackendWithThreads(1), g, 16, 48, Forced(o, 1));
  ASSERT_OK(single.status);
  EXPECT_LE(RelativeError(sharded, single.values), kHighestTolerance);
}

TEST(ShardedTest, SplitQkvScalesEachPartByItsGlobalShape) {
  NsOptions o;
  o.precision = Precision::kHighest;
  o.split_qkv = {2, 1, 1};
  const int64_t rows = 32, cols = 12;  // 8 groups of 4 rows; shards of 8 and 24 rows.
  std::vector<double> g = RandomMatrix(rows, cols, 61);
  std::vector<double> sharded;
  {
    // Group-aligned shards: rows [0, 8) and [8, 32).
    std::vector<char> in0 = Pack(std::vector<double>(g.begin(), g.begin() + 8 * cols), DType::kF32);
    std::vector<char> in1 = Pack(std::vector<double>(g.begin() + 8 * cols, g.end()), DType::kF32);
    std::vector<char> out0(in0.size()), out1(in1.size());
    ThreadSumReducer reducer(2);
    absl::Status s0, s1;
    std::thread t0([&] {
      ThreadSumReducer::Participant p(&reducer, 0);
      s0 = OrthogonalizeSharded(CpuBackendWithThreads(1), "qkv", {rows, cols}, 0, o,
                                {NsShard{{8, cols}, DType::kF32, in0.data(), DType::kF32, out0.data()}}, p);
    });
    std::thread t1([&] {
      ThreadSumReducer::Participant p(&reducer, 1);
      s1 = OrthogonalizeSharded(CpuBackendWithThreads(1), "qkv", {rows, cols}, 0, o,
                                {NsShard{{24, cols}, DType::kF32, in1.data(), DType::kF32, out1.data()}}, p);
    });
    t0.join();
    t1.join();
    ASSERT_OK(s0);
    ASSERT_OK(s1);
    sharded = Unpack(out0, DType::kF32);
    std::vector<double> rest = Unpack(out1, DType::kF32);
    sharded.insert(sharded.end(), rest.begin(), rest.end());
  }
  NsRun single = RunNs(CpuBackendWithThreads(1), g, rows, cols, Forced(o, 0));
  ASSERT_OK(single.status);
  EXPECT_LE(RelativeError(sharded, single.values), kHighestTolerance);
}

TEST(ShardedTest, ShardNotSpanningTheGramSideIsInvalidArgument) {
  std::vector<float> in(6 * 4), out(6 * 4);
  NsKernelArgs args;
  args.schedule = {{3.0, -3.0, 1.0}};
  NsShardedTask task{{NsShard{{6, 4}, DType::kF32, in.data(), DType::kF32, out.data()}}, 0, 5, &args};
  ThreadSumReducer reducer(1);
  ThreadSumReducer::Participant p(&reducer, 0);
  EXPECT_THAT(CpuBackendWithThreads(1).RunSharded(task, p),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("span the unsharded dim")));
  task.partition_dim = 2;
  EXPECT_THAT(CpuBackendWithThreads(1).RunSharded(task, p),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("partition_dim")));
}

}  // namespace
}  // namespace orthoserve::testing
