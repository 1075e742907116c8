// Implementation of server/engine/cpu/cpu_backend.h.
#include "server/engine/cpu/cpu_backend.h"

#include <cblas.h>

#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engine/cpu/elementwise_ns.h"
#include "server/engine/cpu/ns_loop.h"
#include "server/engine/cpu/working_matrix.h"

namespace orthoserve {
namespace {

constexpr int kMaxThreads = 256;

// See the header: OpenBLAS's thread count is process-wide, so it is set once, to 1.
void PinOpenBlasToOneThread() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  });
}

absl::Status CheckBuffers(const void* in, const void* out, Matrix2d shape, MemorySpace space,
                          const std::string& what) {
  if (space != MemorySpace::kHost) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": buffers in device memory, which the cpu backend has none of"));
  }
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null input or output buffer"));
  }
  if (shape.rows <= 0 || shape.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", shape.rows, "x", shape.cols, " must be positive"));
  }
  return absl::OkStatus();
}

// Allocates a shard's working buffers (gram × n each).
absl::Status Allocate(WorkingShard& shard, int64_t gram, int64_t n) {
  shard.n = n;
  try {
    shard.x.resize(static_cast<size_t>(gram * n));
    shard.y.resize(static_cast<size_t>(gram * n));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate two ", gram, "x", n, " fp32 working matrices"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const Options& options) {
  if (options.threads < 1 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend threads = ", options.threads, " is out of range; use 1 to ", kMaxThreads));
  }
  PinOpenBlasToOneThread();
  return std::unique_ptr<CpuBackend>(new CpuBackend(options));
}

CpuBackend::CpuBackend(const Options& options)
    : options_(options), pool_(std::make_unique<ParallelFor>(options.threads)) {}

BackendInfo CpuBackend::Info() const {
  BackendInfo info;
  info.name = "cpu";
  info.device =
      absl::StrCat(openblas_get_config(), ", ", options_.threads, options_.threads == 1 ? " thread" : " threads");
  return info;
}

std::vector<absl::Status> CpuBackend::Run(absl::Span<const NsTask> tasks) {
  std::vector<absl::Status> results;
  results.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    results.push_back(Annotate(RunOne(tasks[i]), absl::StrCat("task ", i)));
  }
  return results;
}

absl::Status CpuBackend::RunOne(const NsTask& task) {
  if (task.args == nullptr) return absl::InvalidArgumentError("null kernel arguments");
  RETURN_IF_ERROR(CheckBuffers(task.in, task.out, task.shape, task.space, "task"));
  const NsKernelArgs& args = *task.args;
  const int64_t rows = task.shape.rows;
  const int64_t cols = task.shape.cols;
  if (args.schedule.empty() && args.normalization == Normalization::kFp32) {
    // With no steps the result is elementwise: the orientation does not matter, and it is
    // computed from `in` to `out` without a working matrix (in fp32 normalization; kBf16 takes
    // the loop's path, which rounds the input first).
    return RunElementwiseNs(*pool_, task);
  }
  const bool transpose = args.transpose;
  const int64_t gram = transpose ? cols : rows;

  std::vector<WorkingShard> shards(1);
  RETURN_IF_ERROR(Allocate(shards[0], gram, transpose ? rows : cols));
  WorkingShard& s = shards[0];
  LoadWorking(task.in_dtype, task.in, rows, cols, transpose, s.y.data(), s.x.data());
  RETURN_IF_ERROR(RunNsLoop(*pool_, args, gram, shards, nullptr));
  StoreWorking(s.x.data(), rows, cols, transpose, args.scale, s.y.data(), task.out_dtype, task.out);
  return absl::OkStatus();
}

absl::Status CpuBackend::RunSharded(const NsShardedTask& task, SumReducer& reducer) {
  if (task.args == nullptr) return absl::InvalidArgumentError("null kernel arguments");
  if (task.partition_dim != 0 && task.partition_dim != 1) {
    return absl::InvalidArgumentError(absl::StrCat("partition_dim = ", task.partition_dim, " must be 0 or 1"));
  }
  if (task.gram_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("gram_size = ", task.gram_size, " must be positive"));
  }
  const bool transpose = task.partition_dim == 0;  // Dim 0 works on Gᵀ: X_s = G_sᵀ.
  const int64_t gram = task.gram_size;
  for (size_t i = 0; i < task.shards.size(); ++i) {
    const NsShard& shard = task.shards[i];
    const std::string what = absl::StrCat("shard ", i);
    RETURN_IF_ERROR(CheckBuffers(shard.in, shard.out, shard.shape, shard.space, what));
    const int64_t whole_dim = transpose ? shard.shape.cols : shard.shape.rows;
    if (whole_dim != gram) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", shard.shape.rows, "x", shard.shape.cols,
                                                     " must span the unsharded dim ", 1 - task.partition_dim,
                                                     " whole (", gram, ")"));
    }
  }

  std::vector<WorkingShard> shards(task.shards.size());
  for (size_t i = 0; i < task.shards.size(); ++i) {
    const NsShard& shard = task.shards[i];
    RETURN_IF_ERROR(Allocate(shards[i], gram, transpose ? shard.shape.rows : shard.shape.cols));
    LoadWorking(shard.in_dtype, shard.in, shard.shape.rows, shard.shape.cols, transpose, shards[i].y.data(),
                shards[i].x.data());
  }
  RETURN_IF_ERROR(RunNsLoop(*pool_, *task.args, gram, shards, &reducer));
  for (size_t i = 0; i < task.shards.size(); ++i) {
    const NsShard& shard = task.shards[i];
    StoreWorking(shards[i].x.data(), shard.shape.rows, shard.shape.cols, transpose, task.args->scale,
                 shards[i].y.data(), shard.out_dtype, shard.out);
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
