// CudaBackend on the CPU: the backend's own sources (grouping, staging through pinned memory,
// pools, pooled contexts, the step loop, TP_DISTRIBUTED's sharded loop) linked with a host
// emulation of the CUDA runtime, cuBLASLt and the kernels (cuda_runtime_emulation.cc,
// cublaslt_emulation.cc) instead of the libraries. Checks its results against the tests'
// reference, and its copies as CudaBackend::Copies counts them: one upload and one download per
// group of same-shape matrices in Run; in RunSharded, each shard's upload and download, and with
// a reducer of host memory the norm's scalars and, every Newton–Schulz step, the Gram matrix down
// to the host for the reduction and back up — none with a reducer of device memory (NCCL's).
// Tasks and shards in the backend's device memory (CudaBackend::memory()) give the same bits with
// no host copy at all. Runs without a GPU.
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/gpu/cublaslt_emulation.h"
#include "tests/gpu/cuda_runtime_emulation.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using gpu_testing::Pack;
using gpu_testing::RandomMatrix;
using gpu_testing::ReferenceFor;
using gpu_testing::RelativeError;
using gpu_testing::Unpack;

std::unique_ptr<CudaBackend> EmulatedBackend() {
  gpu_emulation::g = gpu_emulation::Emulation{};
  gpu_emulation::g.device_count = 1;
  auto created = CudaBackend::Create(CudaBackend::Options{});
  EXPECT_OK(created.status());
  return created.ok() ? *std::move(created) : nullptr;
}

// One task owning its buffers.
struct OwnedTask {
  std::vector<double> g;
  std::vector<char> in, out;
  NsOptions options;
  NsKernelArgs args;
  NsTask task;
  OwnedTask(int64_t rows, int64_t cols, Precision precision, DType out_dtype, uint32_t seed)
      : g(RandomMatrix(rows, cols, seed)) {
    options.precision = precision;
    in = Pack(g, DType::kF32);
    out.assign(static_cast<size_t>(rows * cols) * ElementSize(out_dtype), 0);
    args = ResolveKernelArgs(options, Matrix2d{rows, cols}, Matrix2d{rows, cols});
    task = NsTask{Matrix2d{rows, cols}, DType::kF32, in.data(), out_dtype, out.data(), &args};
  }
};

TEST(CudaBackendEmulationTest, RunMatchesTheReferenceAndCopiesOncePerGroupEachWay) {
  std::unique_ptr<CudaBackend> backend = EmulatedBackend();
  ASSERT_NE(backend, nullptr);
  EXPECT_THAT(backend->Info().device, ::testing::HasSubstr("Emulated"));
  // Two groups: three 48 x 80 MEDIUM tasks with bf16 results, then one 64 x 40 HIGHEST task.
  std::vector<std::unique_ptr<OwnedTask>> tasks;
  for (int j = 0; j < 3; ++j) tasks.push_back(std::make_unique<OwnedTask>(48, 80, Precision::kMedium, DType::kBF16, 1 + j));
  tasks.push_back(std::make_unique<OwnedTask>(64, 40, Precision::kHighest, DType::kF32, 9));
  std::vector<NsTask> batch;
  for (const auto& t : tasks) batch.push_back(t->task);
  const std::vector<absl::Status> statuses = backend->Run(batch);
  ASSERT_EQ(statuses.size(), tasks.size());
  for (size_t j = 0; j < tasks.size(); ++j) {
    ASSERT_TRUE(statuses[j].ok()) << "task " << j << ": " << statuses[j];
    const OwnedTask& t = *tasks[j];
    const std::vector<double> got = Unpack(t.out, t.task.out_dtype);
    const std::vector<double> want = ReferenceFor(t.g, t.task.shape.rows, t.task.shape.cols, t.options);
    EXPECT_LT(RelativeError(got, want), t.options.precision == Precision::kMedium ? 1e-2 : 1e-5) << "task " << j;
  }
  const CopyCounts c = backend->Copies();
  EXPECT_EQ(c.h2d_calls, 2);
  EXPECT_EQ(c.h2d_bytes, 3 * 48 * 80 * 4 + 64 * 40 * 4);
  EXPECT_EQ(c.d2h_calls, 2);
  EXPECT_EQ(c.d2h_bytes, 3 * 48 * 80 * 2 + 64 * 40 * 4);
}

// One participant of TP_DISTRIBUTED: the reduction is the identity. `device`: it says it takes
// device memory (as the NCCL collective's reducer does).
class AloneReducer final : public SumReducer {
 public:
  explicit AloneReducer(bool device = false) : device_(device) {}
  bool ReducesDeviceMemory() const override { return device_; }
  absl::Status AllReduceSum(absl::Span<float>) override {
    ++calls;
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(absl::Span<double>) override {
    ++calls;
    return absl::OkStatus();
  }
  int calls = 0;

 private:
  const bool device_;
};

// TP_DISTRIBUTED's sharded task on the emulated backend: a 32 x 72 matrix in two row shards
// (partition_dim 0 works on Gᵀ: the Gram is cols x cols), one participant, HIGHEST.
constexpr int64_t kRows = 32, kCols = 72, kHalf = kRows / 2;
constexpr int64_t kShardBytes = kHalf * kCols * 4, kGramBytes = kCols * kCols * 4;

// The test matrix as two row shards over `in` and `out` (in `space`), partition_dim 0.
NsShardedTask TwoRowShards(const NsKernelArgs& args, char* in, char* out, MemorySpace space) {
  NsShardedTask task;
  task.partition_dim = 0;
  task.gram_size = kCols;
  task.args = &args;
  for (int s = 0; s < 2; ++s) {
    const size_t offset = static_cast<size_t>(s * kHalf * kCols) * sizeof(float);
    task.shards.push_back(
        NsShard{Matrix2d{kHalf, kCols}, DType::kF32, in + offset, DType::kF32, out + offset, space});
  }
  return task;
}

struct ShardedRun {
  std::vector<char> out;
  CopyCounts copies;
  int reductions = 0;
};
ShardedRun RunSharded(bool reducer_takes_device_memory, const NsKernelArgs& args, const std::vector<double>& g) {
  ShardedRun run;
  std::unique_ptr<CudaBackend> backend = EmulatedBackend();
  if (backend == nullptr) return run;
  std::vector<char> in = Pack(g, DType::kF32);
  run.out.assign(in.size(), 0);
  const NsShardedTask task = TwoRowShards(args, in.data(), run.out.data(), MemorySpace::kHost);
  AloneReducer reducer(reducer_takes_device_memory);
  EXPECT_OK(backend->RunSharded(task, reducer));
  run.reductions = reducer.calls;
  run.copies = backend->Copies();
  return run;
}

TEST(CudaBackendEmulationTest, RunShardedReducesTheGramOnTheDeviceWhenTheReducerTakesDeviceMemory) {
  const std::vector<double> g = RandomMatrix(kRows, kCols, 5);
  NsOptions options;
  options.precision = Precision::kHighest;
  const NsKernelArgs args = ResolveKernelArgs(options, Matrix2d{kRows, kCols}, Matrix2d{kRows, kCols});
  const int64_t steps = static_cast<int64_t>(args.schedule.size());
  ASSERT_GT(steps, 0);

  // A reducer of host memory (Gloo): every step's Gram goes down to the host and back up.
  const ShardedRun host = RunSharded(false, args, g);
  EXPECT_EQ(host.reductions, 1 + steps);  // The norm, then each step's Gram.
  EXPECT_LT(RelativeError(Unpack(host.out, DType::kF32), ReferenceFor(g, kRows, kCols, options)), 1e-5);
  // Up: each shard, the norm's sum, each step's reduced Gram. Down: each shard's partial sum of
  // squares, each step's local Gram, each shard's result.
  EXPECT_EQ(host.copies.h2d_calls, 2 + 1 + steps);
  EXPECT_EQ(host.copies.h2d_bytes, 2 * kShardBytes + 8 + steps * kGramBytes);
  EXPECT_EQ(host.copies.d2h_calls, 2 + steps + 2);
  EXPECT_EQ(host.copies.d2h_bytes, 2 * 8 + steps * kGramBytes + 2 * kShardBytes);

  // A reducer of device memory (NCCL): the norm and the Gram stay on the device; the same bits.
  const ShardedRun device = RunSharded(true, args, g);
  EXPECT_EQ(device.reductions, 1 + steps);
  EXPECT_EQ(device.out, host.out);
  EXPECT_EQ(device.copies.h2d_calls, 2);
  EXPECT_EQ(device.copies.h2d_bytes, 2 * kShardBytes);
  EXPECT_EQ(device.copies.d2h_calls, 2);
  EXPECT_EQ(device.copies.d2h_bytes, 2 * kShardBytes);
}

// A host buffer's bytes in a new buffer of the backend's device memory.
MemoryBuffer ToDevice(Memory& memory, const std::vector<char>& host) {
  absl::StatusOr<MemoryBuffer> buffer = memory.Allocate(host.size(), false, "test");
  EXPECT_OK(buffer.status());
  EXPECT_OK(memory.Copy(buffer->data(), MemorySpace::kDevice, host.data(), MemorySpace::kHost, host.size()));
  return *std::move(buffer);
}
std::vector<char> ToHost(Memory& memory, const MemoryBuffer& device) {
  std::vector<char> host(device.size());
  EXPECT_OK(memory.Copy(host.data(), MemorySpace::kHost, device.data(), MemorySpace::kDevice, host.size()));
  return host;
}

TEST(CudaBackendEmulationTest, MemoryHandsOutDeviceBuffersAndCountsItsCopies) {
  std::unique_ptr<CudaBackend> backend = EmulatedBackend();
  ASSERT_NE(backend, nullptr);
  Memory& memory = backend->memory();
  EXPECT_EQ(memory.space(), MemorySpace::kDevice);
  absl::StatusOr<MemoryBuffer> zeroed = memory.Allocate(96, true, "test");
  ASSERT_OK(zeroed.status());
  MemoryBuffer a = *std::move(zeroed);
  EXPECT_TRUE(gpu_emulation::IsDeviceMemory(a.data(), 96));
  EXPECT_EQ(ToHost(memory, a), std::vector<char>(96, 0));  // Zeroed.
  // A 3 x 4-byte rectangle of a 6 x 8-byte host matrix, up into a dense device block, across
  // within the device, and down again.
  std::vector<char> host(48);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<char>(i);
  EXPECT_OK(memory.Copy2d(Copy2dArgs{a.data(), 4, MemorySpace::kDevice, host.data() + 10, 8, MemorySpace::kHost, 3, 4}));
  absl::StatusOr<MemoryBuffer> dense = memory.Allocate(12, false, "test");
  ASSERT_OK(dense.status());
  MemoryBuffer b = *std::move(dense);
  EXPECT_OK(memory.Copy(b.data(), MemorySpace::kDevice, a.data(), MemorySpace::kDevice, 12));
  EXPECT_EQ(ToHost(memory, b), (std::vector<char>{10, 11, 12, 13, 18, 19, 20, 21, 26, 27, 28, 29}));
  const CopyCounts c = backend->Copies();
  EXPECT_EQ(c.h2d_calls, 1);
  EXPECT_EQ(c.h2d_bytes, 12);
  EXPECT_EQ(c.d2d_calls, 1);
  EXPECT_EQ(c.d2d_bytes, 12);
  EXPECT_EQ(c.d2h_calls, 2);
  EXPECT_EQ(c.d2h_bytes, 96 + 12);
  // Over the budget: RESOURCE_EXHAUSTED, not a crash.
  EXPECT_EQ(memory.Allocate(size_t{64} << 30, false, "huge").status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CudaBackendEmulationTest, TasksInDeviceMemoryGiveTheSameBitsWithNoHostCopy) {
  std::unique_ptr<CudaBackend> backend = EmulatedBackend();
  ASSERT_NE(backend, nullptr);
  std::vector<std::unique_ptr<OwnedTask>> tasks;
  for (int j = 0; j < 2; ++j) tasks.push_back(std::make_unique<OwnedTask>(48, 80, Precision::kMedium, DType::kBF16, 1 + j));
  tasks.push_back(std::make_unique<OwnedTask>(64, 40, Precision::kHighest, DType::kF32, 9));
  std::vector<NsTask> on_host;
  for (const auto& t : tasks) on_host.push_back(t->task);
  for (const absl::Status& s : backend->Run(on_host)) ASSERT_OK(s);

  Memory& memory = backend->memory();
  std::vector<MemoryBuffer> ins, outs;
  std::vector<NsTask> on_device;
  for (const auto& t : tasks) {
    ins.push_back(ToDevice(memory, t->in));
    outs.push_back(ToDevice(memory, std::vector<char>(t->out.size(), 0)));
    NsTask task = t->task;
    task.in = ins.back().data();
    task.out = outs.back().data();
    task.space = MemorySpace::kDevice;
    on_device.push_back(task);
  }
  const CopyCounts before = backend->Copies();
  for (const absl::Status& s : backend->Run(on_device)) ASSERT_OK(s);
  const CopyCounts after = backend->Copies();
  EXPECT_EQ(after.h2d_calls, before.h2d_calls);  // Nothing between the host and the device.
  EXPECT_EQ(after.d2h_calls, before.d2h_calls);
  EXPECT_EQ(after.d2d_calls - before.d2d_calls, 2 * 3);  // Into the group's batch and out, per task.
  for (size_t j = 0; j < tasks.size(); ++j) EXPECT_EQ(ToHost(memory, outs[j]), tasks[j]->out) << "task " << j;

  // The engine takes device jobs on a backend with device memory.
  MatrixJob job{"w", Matrix2d{48, 80}, Matrix2d{48, 80}, DType::kF32, ins[0].data(), DType::kBF16, outs[0].data(),
                &tasks[0]->options};
  job.space = MemorySpace::kDevice;
  EXPECT_OK(OrthogonalizeOne(*backend, job));
  EXPECT_EQ(ToHost(memory, outs[0]), tasks[0]->out);
}

TEST(CudaBackendEmulationTest, ShardsInDeviceMemoryGiveTheSameBitsWithNoHostCopy) {
  const std::vector<double> g = RandomMatrix(kRows, kCols, 5);
  NsOptions options;
  options.precision = Precision::kHighest;
  const NsKernelArgs args = ResolveKernelArgs(options, Matrix2d{kRows, kCols}, Matrix2d{kRows, kCols});
  const ShardedRun host = RunSharded(true, args, g);

  std::unique_ptr<CudaBackend> backend = EmulatedBackend();
  ASSERT_NE(backend, nullptr);
  Memory& memory = backend->memory();
  const std::vector<char> in = Pack(g, DType::kF32);
  MemoryBuffer din = ToDevice(memory, in);
  MemoryBuffer dout = ToDevice(memory, std::vector<char>(in.size(), 0));
  const NsShardedTask task = TwoRowShards(args, din.data(), dout.data(), MemorySpace::kDevice);
  AloneReducer reducer(true);
  const CopyCounts before = backend->Copies();
  ASSERT_OK(backend->RunSharded(task, reducer));
  const CopyCounts after = backend->Copies();
  EXPECT_EQ(after.h2d_calls, before.h2d_calls);
  EXPECT_EQ(after.d2h_calls, before.d2h_calls);
  EXPECT_EQ(ToHost(memory, dout), host.out);
}

}  // namespace
}  // namespace orthoserve
