// A fleet of emulated GPU ranks on the CPU: every rank a thread with its own CudaBackend (the
// backend's sources linked with the host emulations of the CUDA runtime, cuBLASLt and the
// kernels), connected by an NCCL stand-in — Gloo on loopback that, like NCCL, takes device
// pointers for every operation (in the emulation device memory is host memory, so Gloo can move
// it) and records which memory each call was handed. Each algorithm's batch runs twice on the
// same emulated ranks: with the stand-in, the distributed layer keeps blocks in the backends'
// device memory; with plain Gloo (host memory only), in host memory. The test holds both to the
// same bits and to the engine's (whole-matrix or blockwise) reference, and the device run to the
// copies of docs/architecture.md, "Memory spaces": on every rank each block goes up once and its
// result comes down once; exchanges, gathers and TP_DISTRIBUTED's reductions stay on the device.
// Runs without a GPU.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/collective.h"
#include "server/distributed/batch.h"
#include "server/engine/cuda/cuda_backend.h"
#include "tests/gpu/cublaslt_emulation.h"
#include "tests/gpu/cuda_runtime_emulation.h"
#include "tests/unit/distributed/batch_harness.h"
#include "tests/util/rank_threads.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using testing::AssembleResult;
using testing::BatchData;
using testing::Layout;
using testing::MakeData;
using testing::MakePlan;
using testing::MatrixSpec;

// What one rank's collective was handed, by the memory of the buffers.
struct Handed {
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
};

// The NCCL stand-in: a collective that takes device memory for every operation, over Gloo.
class DeviceCollective final : public Collective {
 public:
  explicit DeviceCollective(std::unique_ptr<Collective> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  std::string name() const override { return "nccl-standin"; }
  bool ReducesDeviceMemory() const override { return true; }
  bool TakesDeviceMemory() const override { return true; }

  absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) override {
    Note(all_to_allv, send, Sum(send_bytes));
    Note(all_to_allv, recv, Sum(recv_bytes));
    return inner_->AllToAllv(send, send_bytes, recv, recv_bytes, timeout);
  }
  absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                          absl::Duration timeout) override {
    Note(all_gatherv, send, send_bytes);
    Note(all_gatherv, recv, Sum(recv_bytes));
    return inner_->AllGatherv(send, send_bytes, recv, recv_bytes, timeout);
  }
  absl::Status AllReduceSum(absl::Span<float> values, absl::Duration timeout) override {
    Note(all_reduce, values.data(), values.size() * sizeof(float));
    return inner_->AllReduceSum(values, timeout);
  }
  absl::Status AllReduceSum(absl::Span<double> values, absl::Duration timeout) override {
    Note(all_reduce, values.data(), values.size() * sizeof(double));
    return inner_->AllReduceSum(values, timeout);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override {
    return inner_->Broadcast(data, bytes, root, timeout);
  }
  absl::Status Barrier(absl::Duration timeout) override { return inner_->Barrier(timeout); }
  void Abort(absl::string_view reason) override { inner_->Abort(reason); }

  Handed all_to_allv, all_gatherv, all_reduce;

 private:
  static size_t Sum(absl::Span<const size_t> sizes) {
    size_t total = 0;
    for (size_t s : sizes) total += s;
    return total;
  }
  static void Note(Handed& handed, const void* p, size_t bytes) {
    if (bytes == 0) return;
    (gpu_emulation::IsDeviceMemory(p, bytes) ? handed.device_bytes : handed.host_bytes) += static_cast<int64_t>(bytes);
  }

  std::unique_ptr<Collective> inner_;
};

struct FleetRun {
  BatchData data;
  std::vector<absl::StatusOr<BatchResult>> results;
  std::vector<CopyCounts> copies;      // Per rank, during ExecuteBatch.
  std::vector<Handed> to_all, gather, reduce;  // Per rank (device run only).
};

// One emulated GPU per fleet rank, made once: the emulation's cuBLASLt state is global.
std::vector<std::unique_ptr<CudaBackend>>& Gpus() {
  static auto* gpus = [] {
    gpu_emulation::g = gpu_emulation::Emulation{};
    gpu_emulation::g.device_count = 1;
    auto* made = new std::vector<std::unique_ptr<CudaBackend>>();
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(CudaBackend::Options{});
      if (!backend.ok()) std::abort();
      made->push_back(*std::move(backend));
    }
    return made;
  }();
  return *gpus;
}

FleetRun RunOnGpus(const BatchPlan& plan, const std::vector<MatrixSpec>& specs, bool device_collective) {
  FleetRun run;
  run.data = MakeData(plan, specs);
  const int world = plan.fleet_world;
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = testing::MakeGlooGroup(world);
  EXPECT_OK(group.status());
  if (!group.ok()) return run;
  std::vector<std::unique_ptr<Collective>> collectives;
  for (std::unique_ptr<Collective>& c : *group) {
    collectives.push_back(device_collective ? std::make_unique<DeviceCollective>(std::move(c)) : std::move(c));
  }
  run.results.assign(world, absl::UnknownError("not run"));
  run.copies.resize(world);
  run.to_all.resize(world);
  run.gather.resize(world);
  run.reduce.resize(world);
  testing::RunRanks(world, [&](int rank) {
    std::vector<LocalBlock> local = testing::LocalBlocksOf(plan, run.data, rank);
    CudaBackend& gpu = *Gpus()[rank];
    const CopyCounts before = gpu.Copies();
    run.results[rank] = ExecuteBatch(plan, local, gpu, *collectives[rank], ExecuteOptions());
    const CopyCounts after = gpu.Copies();
    run.copies[rank] = CopyCounts{after.h2d_bytes - before.h2d_bytes, after.h2d_calls - before.h2d_calls,
                                  after.d2h_bytes - before.d2h_bytes, after.d2h_calls - before.d2h_calls,
                                  after.d2d_bytes - before.d2d_bytes, after.d2d_calls - before.d2d_calls};
    if (device_collective) {
      const auto& d = static_cast<const DeviceCollective&>(*collectives[rank]);
      run.to_all[rank] = d.all_to_allv;
      run.gather[rank] = d.all_gatherv;
      run.reduce[rank] = d.all_reduce;
    }
  });
  return run;
}

// The blocks fleet rank `rank` holds: how many are non-empty, their input and result bytes.
struct Held {
  int64_t blocks = 0, in_bytes = 0, out_bytes = 0;
};
Held HeldOn(const BatchPlan& plan, int rank) {
  Held held;
  for (const MatrixPlan& m : plan.matrices) {
    for (const BlockPlacement& p : m.blocks) {
      if (p.fleet_rank != rank || p.block.empty()) continue;
      ++held.blocks;
      held.in_bytes += p.block.numel() * static_cast<int64_t>(ElementSize(m.dtype));
      held.out_bytes += p.block.numel() * static_cast<int64_t>(ElementSize(m.result_dtype));
    }
  }
  return held;
}

// Two matrices of one algorithm in the layout it needs (different shapes and dtypes, so that
// blocks neither group nor line up by accident).
std::vector<MatrixSpec> SpecsFor(Algorithm algorithm) {
  MatrixSpec a;
  a.name = "a";
  a.shape = {48, 80};
  a.seed = 3;
  MatrixSpec b;
  b.name = "b";
  b.shape = {72, 40};
  b.dtype = b.result_dtype = DType::kBF16;
  b.seed = 4;
  a.options.precision = Precision::kHighest;
  b.options.precision = Precision::kMedium;
  for (MatrixSpec* s : {&a, &b}) s->algorithm = algorithm;
  switch (algorithm) {
    case Algorithm::kAuto:
      a.layout = Layout::kGrid;
      b.layout = Layout::kCols;
      break;
    case Algorithm::kRowSharded:
      a.layout = b.layout = Layout::kRows;
      break;
    case Algorithm::kGathered:
      a.layout = Layout::kGrid;
      b.layout = Layout::kReversedRows;
      break;
    case Algorithm::kTpDuplicated:
    case Algorithm::kTpDistributed:
      a.layout = Layout::kRows;
      a.partition_dim = 0;
      b.layout = Layout::kCols;
      b.partition_dim = 1;
      break;
    case Algorithm::kTpBlockwise:
      a.layout = Layout::kCols;
      b.layout = Layout::kRows;
      break;
  }
  return {a, b};
}

struct Case {
  Algorithm algorithm;
  int trainer_world;
  int fleet_world;
};

class CudaFleetEmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaFleetEmulationTest, BlocksGoUpOnceAndDownOnceAndGiveTheHostPathsBits) {
  const Case c = GetParam();
  const std::vector<MatrixSpec> specs = SpecsFor(c.algorithm);
  const BatchPlan plan = MakePlan(c.trainer_world, c.fleet_world, specs);

  FleetRun host = RunOnGpus(plan, specs, /*device_collective=*/false);
  FleetRun device = RunOnGpus(plan, specs, /*device_collective=*/true);
  ASSERT_EQ(device.results.size(), static_cast<size_t>(c.fleet_world));
  ASSERT_EQ(host.results.size(), static_cast<size_t>(c.fleet_world));
  for (int r = 0; r < c.fleet_world; ++r) {
    ASSERT_OK(host.results[r].status());
    ASSERT_OK(device.results[r].status());
    for (const absl::Status& s : device.results[r]->matrices) ASSERT_OK(s);
    for (const absl::Status& s : host.results[r]->matrices) ASSERT_OK(s);
  }

  Backend& gpu = *Gpus()[0];
  for (size_t m = 0; m < plan.matrices.size(); ++m) {
    const MatrixPlan& mp = plan.matrices[m];
    const std::vector<char> got = AssembleResult(plan, device.data, static_cast<int>(m));
    // Device memory or host memory: the same bits.
    EXPECT_EQ(got, AssembleResult(plan, host.data, static_cast<int>(m))) << "matrix " << mp.name;
    // And the engine's, where the design says so (TP_DISTRIBUTED's sum of shards is the seed's
    // arithmetic, not the whole matrix's: close to it).
    if (c.algorithm == Algorithm::kTpBlockwise) {
      EXPECT_EQ(got, testing::BlockwiseReference(gpu, mp, device.data.whole[m])) << "matrix " << mp.name;
    } else if (c.algorithm != Algorithm::kTpDistributed) {
      EXPECT_EQ(got, testing::WholeReference(gpu, mp, device.data.whole[m])) << "matrix " << mp.name;
    } else {
      const double error = testing::RelativeFrobenius(testing::ToF32(mp.result_dtype, got),
                                                      testing::ToF32(mp.result_dtype, testing::WholeReference(
                                                                                          gpu, mp, device.data.whole[m])));
      EXPECT_LT(error, mp.options.precision == Precision::kMedium ? 2e-2 : 1e-5) << "matrix " << mp.name;
    }
  }

  for (int r = 0; r < c.fleet_world; ++r) {
    const Held held = HeldOn(plan, r);
    const CopyCounts& copies = device.copies[r];
    SCOPED_TRACE(::testing::Message() << "fleet rank " << r);
    // Every byte of a block goes up once and every byte of its result comes down once.
    EXPECT_EQ(copies.h2d_bytes, held.in_bytes);
    EXPECT_EQ(copies.d2h_bytes, held.out_bytes);
    if (c.algorithm == Algorithm::kTpBlockwise) {
      // Blocks stay in the caller's buffers; the backend uploads each group of same-shape blocks
      // in one call.
      EXPECT_LE(copies.h2d_calls, held.blocks);
      EXPECT_LE(copies.d2h_calls, held.blocks);
    } else {
      EXPECT_EQ(copies.h2d_calls, held.blocks);
      EXPECT_EQ(copies.d2h_calls, held.blocks);
    }
    // What travelled between ranks did so in device memory; only the status exchange's few
    // bytes (codes and message lengths) went through host memory.
    EXPECT_EQ(device.to_all[r].host_bytes, 0);
    // TP_DISTRIBUTED's payloads (the norm, each step's Gram) are reduced on the device; only the
    // guard's headers, four doubles before each payload and one at the end (guarded_reducer.h),
    // are host memory.
    int64_t headers = 0;
    for (const MatrixPlan& mp : plan.matrices) {
      if (mp.algorithm == Algorithm::kTpDistributed) headers += 1 + mp.options.steps + 1;
    }
    EXPECT_EQ(device.reduce[r].host_bytes, headers * 4 * static_cast<int64_t>(sizeof(double)));
    EXPECT_LE(device.gather[r].host_bytes, 64 * c.fleet_world);
    const bool exchanges = c.algorithm == Algorithm::kAuto || c.algorithm == Algorithm::kRowSharded;
    const bool gathers = c.algorithm == Algorithm::kGathered || c.algorithm == Algorithm::kTpDuplicated;
    if (exchanges) {
      EXPECT_GT(device.to_all[r].device_bytes, 0);
    }
    if (gathers) {
      EXPECT_GT(device.gather[r].device_bytes, 0);
    }
    if (c.algorithm == Algorithm::kTpDistributed) {
      EXPECT_GT(device.reduce[r].device_bytes, 0);
    }
    // The host run moved the same blocks through host memory: the backend uploaded whole
    // matrices or shards instead (nothing device to device).
    EXPECT_EQ(host.copies[r].d2d_calls, 0);
  }
}

// A rank whose device memory cannot hold the batch's buffers fails the batch with
// RESOURCE_EXHAUSTED and aborts the collective: its peer fails at once, not at its timeout.
TEST(CudaFleetEmulationFailureTest, ABufferOverTheBudgetFailsTheBatchOnEveryRankAtOnce) {
  Gpus();  // The emulation's state, set up once.
  CudaBackend::Options small;
  small.memory_budget_bytes = 4096;
  absl::StatusOr<std::unique_ptr<CudaBackend>> tight = CudaBackend::Create(small);
  ASSERT_OK(tight.status());
  const std::vector<MatrixSpec> specs = SpecsFor(Algorithm::kAuto);
  const BatchPlan plan = MakePlan(4, 2, specs);
  BatchData data = MakeData(plan, specs);
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = testing::MakeGlooGroup(2);
  ASSERT_OK(group.status());
  std::vector<std::unique_ptr<Collective>> collectives;
  for (std::unique_ptr<Collective>& c : *group) collectives.push_back(std::make_unique<DeviceCollective>(std::move(c)));
  ExecuteOptions options;
  options.collective_timeout = absl::Seconds(60);
  std::vector<absl::StatusOr<BatchResult>> results(2, absl::UnknownError("not run"));
  const absl::Time start = absl::Now();
  testing::RunRanks(2, [&](int rank) {
    std::vector<LocalBlock> local = testing::LocalBlocksOf(plan, data, rank);
    Backend& gpu = rank == 0 ? static_cast<Backend&>(**tight) : *Gpus()[1];
    results[rank] = ExecuteBatch(plan, local, gpu, *collectives[rank], options);
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kResourceExhausted) << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()), ::testing::HasSubstr("auto"));
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kUnavailable) << results[1].status();
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(AlgorithmName(info.param.algorithm), "_W", info.param.trainer_world, "_S",
                      info.param.fleet_world);
}

INSTANTIATE_TEST_SUITE_P(
    EveryAlgorithm, CudaFleetEmulationTest,
    ::testing::Values(Case{Algorithm::kAuto, 4, 2}, Case{Algorithm::kAuto, 3, 3}, Case{Algorithm::kRowSharded, 4, 2},
                      Case{Algorithm::kRowSharded, 4, 4}, Case{Algorithm::kGathered, 4, 2},
                      Case{Algorithm::kGathered, 3, 3}, Case{Algorithm::kTpDuplicated, 4, 2},
                      Case{Algorithm::kTpDuplicated, 4, 4}, Case{Algorithm::kTpDistributed, 4, 2},
                      Case{Algorithm::kTpDistributed, 4, 4}, Case{Algorithm::kTpBlockwise, 4, 2},
                      Case{Algorithm::kTpBlockwise, 4, 4}),
    CaseName);

}  // namespace
}  // namespace orthoserve
