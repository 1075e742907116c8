// CudaBackend::RunSharded (TP_DISTRIBUTED) with several participants as threads sharing one
// GPU backend and an in-process SumReducer: the result matches whole-matrix NS with the forced
// orientation (HIGHEST within 1e-5 of float64; MEDIUM within 3e-2, the per-shard bf16 Gram
// rounding of the contract adding its own noise), and a participant without shards takes part.
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using gpu_testing::Pack;
using gpu_testing::RandomMatrix;
using gpu_testing::ReferenceNs;
using gpu_testing::RelativeError;
using gpu_testing::Unpack;

// Sums in participant order once all `world` participants have contributed.
class ThreadSumGroup {
 public:
  explicit ThreadSumGroup(int world) : world_(world), parts_(world) {}

  template <typename T>
  absl::Status Reduce(int participant, absl::Span<T> values) {
    std::unique_lock<std::mutex> lock(mu_);
    parts_[participant].assign(values.begin(), values.end());
    const uint64_t generation = generation_;
    if (++arrived_ == world_) {
      std::vector<T> sum(values.size(), T(0));
      for (int p = 0; p < world_; ++p) {
        if (parts_[p].size() != values.size()) return absl::InternalError("participants disagree on the count");
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<T>(sum[i] + static_cast<T>(parts_[p][i]));
      }
      result_.assign(sum.begin(), sum.end());
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<T>(result_[i]);
    return absl::OkStatus();
  }

 private:
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<double>> parts_;
  std::vector<double> result_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class ParticipantReducer final : public SumReducer {
 public:
  ParticipantReducer(ThreadSumGroup* group, int participant) : group_(group), participant_(participant) {}
  absl::Status AllReduceSum(absl::Span<float> values) override { return group_->Reduce(participant_, values); }
  absl::Status AllReduceSum(absl::Span<double> values) override { return group_->Reduce(participant_, values); }

 private:
  ThreadSumGroup* group_;
  int participant_;
};

CudaBackend& SharedCudaBackend() {
  static CudaBackend* backend = [] {
    auto created = CudaBackend::Create(CudaBackend::Options{});
    if (!created.ok()) std::abort();
    return created->release();
  }();
  return *backend;
}

// Cuts the row-major rows × cols matrix into trainer shards along `dim` at `cuts` (offsets,
// last = extent), each a dense matrix of its own.
std::vector<std::vector<double>> Cut(const std::vector<double>& g, int64_t rows, int64_t cols, int dim,
                                     const std::vector<int64_t>& cuts, std::vector<Matrix2d>* shapes) {
  std::vector<std::vector<double>> out;
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    const int64_t lo = cuts[s], hi = cuts[s + 1];
    std::vector<double> part;
    if (dim == 0) {
      part.assign(g.begin() + lo * cols, g.begin() + hi * cols);
      shapes->push_back(Matrix2d{hi - lo, cols});
    } else {
      for (int64_t i = 0; i < rows; ++i) part.insert(part.end(), g.begin() + i * cols + lo, g.begin() + i * cols + hi);
      shapes->push_back(Matrix2d{rows, hi - lo});
    }
    out.push_back(std::move(part));
  }
  return out;
}

struct ShardedCase {
  int partition_dim;
  Precision precision;
  double tolerance;
};

class CudaShardedTest : public ::testing::TestWithParam<ShardedCase> {};

TEST_P(CudaShardedTest, MatchesWholeMatrixReference) {
  SKIP_WITHOUT_GPU();
  const ShardedCase c = GetParam();
  const int64_t rows = 256, cols = 192;
  const std::vector<double> g = RandomMatrix(rows, cols, 31);
  const int64_t extent = c.partition_dim == 0 ? rows : cols;
  std::vector<Matrix2d> shapes;
  // Four trainer shards of uneven size; participant 0 holds shards 0 and 1, participant 1 holds
  // shards 2 and 3, participant 2 holds none.
  const std::vector<int64_t> cuts = {0, extent / 8, extent / 2, extent / 2 + 40, extent};
  const auto parts = Cut(g, rows, cols, c.partition_dim, cuts, &shapes);
  const std::vector<std::vector<int>> held = {{0, 1}, {2, 3}, {}};

  NsOptions options;
  options.precision = c.precision;
  std::vector<std::vector<char>> in(parts.size()), out(parts.size());
  for (size_t s = 0; s < parts.size(); ++s) {
    in[s] = Pack(parts[s], DType::kF32);
    out[s].assign(in[s].size(), 0);
  }
  ThreadSumGroup group(static_cast<int>(held.size()));
  std::vector<absl::Status> statuses(held.size());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < held.size(); ++p) {
    threads.emplace_back([&, p] {
      std::vector<NsShard> shards;
      for (int s : held[p]) shards.push_back(NsShard{shapes[s], DType::kF32, in[s].data(), DType::kF32, out[s].data()});
      ParticipantReducer reducer(&group, static_cast<int>(p));
      statuses[p] = OrthogonalizeSharded(SharedCudaBackend(), "w", Matrix2d{rows, cols}, c.partition_dim, options,
                                         shards, reducer);
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) ASSERT_OK(s);

  // Reassemble and compare with the whole-matrix reference in the forced orientation.
  std::vector<double> result(g.size());
  for (size_t s = 0; s < parts.size(); ++s) {
    const std::vector<double> v = Unpack(out[s], DType::kF32);
    for (int64_t i = 0; i < shapes[s].rows; ++i) {
      for (int64_t j = 0; j < shapes[s].cols; ++j) {
        const int64_t gi = c.partition_dim == 0 ? cuts[s] + i : i;
        const int64_t gj = c.partition_dim == 0 ? j : cuts[s] + j;
        result[gi * cols + gj] = v[i * shapes[s].cols + j];
      }
    }
  }
  NsOptions forced = options;
  forced.transpose = c.partition_dim == 0 ? TransposeMode::kOn : TransposeMode::kOff;
  const NsKernelArgs args = ResolveKernelArgs(forced, Matrix2d{rows, cols}, Matrix2d{rows, cols});
  const std::vector<double> ref = ReferenceNs(g, rows, cols, args, c.precision == Precision::kMedium);
  EXPECT_LT(RelativeError(result, ref), c.tolerance);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaShardedTest,
                         ::testing::Values(ShardedCase{0, Precision::kHighest, 1e-5},
                                           ShardedCase{1, Precision::kHighest, 1e-5},
                                           ShardedCase{0, Precision::kMedium, 3e-2},
                                           ShardedCase{1, Precision::kMedium, 3e-2}));

}  // namespace
}  // namespace orthoserve
