// Implementation of server/engine/cuda/cuda_backend.h: creation, info and the pipelined Run.
#include "server/engine/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "server/engine/cuda/cuda_backend_impl.h"
#include "server/engine/cuda/cuda_status.h"
#include "server/engine/cuda/kernels.h"
#include "server/engine/cuda/ns_steps.h"

namespace orthoserve {

using cuda::CudaCall;

CudaBackend::Impl::Impl(int device_in, std::string name, int64_t budget_in, int64_t pinned_cache)
    : device(device_in),
      device_name(std::move(name)),
      budget(budget_in),
      device_pool(cuda::MemoryPool::Options{cuda::MemoryPool::Kind::kDevice, budget_in, 0}),
      pinned_pool(cuda::MemoryPool::Options{cuda::MemoryPool::Kind::kPinnedHost, 0, pinned_cache}) {}

absl::StatusOr<std::unique_ptr<CudaBackend::Impl::Lease>> CudaBackend::Impl::Take() {
  RETURN_IF_ERROR(CudaCall(cudaSetDevice(device), "cudaSetDevice"));
  std::unique_ptr<cuda::Context> ctx;
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      ctx = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (ctx == nullptr) {
    ASSIGN_OR_RETURN(ctx, cuda::Context::Create());
  }
  return std::make_unique<Lease>(this, std::move(ctx));
}

void CudaBackend::Impl::Return(std::unique_ptr<cuda::Context> ctx) {
  if (ctx == nullptr) return;
  absl::MutexLock lock(&mu_);
  free_.push_back(std::move(ctx));
}

bool CudaBackend::Impl::TakeInjectedFailure() {
  int n = injected_failures.load();
  while (n > 0) {
    if (injected_failures.compare_exchange_weak(n, n - 1)) return true;
  }
  return false;
}

absl::Status CheckTask(const NsTask& task) {
  if (task.in == nullptr || task.out == nullptr || task.args == nullptr) {
    return absl::InvalidArgumentError("task has a null input, output or args pointer");
  }
  if (task.shape.rows <= 0 || task.shape.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task shape ", task.shape.rows, "x", task.shape.cols, " must be positive"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Enqueue(cuda::Context& ctx, cuda::Slot& slot, size_t index, const NsTask& task) {
  const NsKernelArgs& args = *task.args;
  const cuda::GemmPrecision prec = cuda::ForPrecision(args.precision);
  const int64_t rows = task.shape.rows, cols = task.shape.cols, numel = rows * cols;
  const bool is_x = args.transpose;  // The row-major buffer read column-major is Gᵀ: X itself when transposing.
  const int64_t m = is_x ? cols : rows;
  const int64_t n = is_x ? rows : cols;
  const size_t in_bytes = static_cast<size_t>(numel) * ElementSize(task.in_dtype);
  const size_t out_bytes = static_cast<size_t>(numel) * ElementSize(task.out_dtype);
  const size_t io_bytes = std::max(in_bytes, out_bytes);
  const size_t x_bytes = static_cast<size_t>(numel) * prec.element_size();
  const size_t mm_bytes = static_cast<size_t>(m * m) * prec.element_size();
  const std::string what = absl::StrCat("task ", index, " (", rows, "x", cols, ")");

  using Pool = cuda::MemoryPool;
  const size_t need = Pool::RoundUp(io_bytes) + 2 * Pool::RoundUp(x_bytes) + 2 * Pool::RoundUp(mm_bytes);
  if (budget > 0 && static_cast<int64_t>(need) > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", need, " bytes of device memory, more than the backend's budget of ", budget, " bytes"));
  }
  slot.task = &task;
  slot.index = index;
  ASSIGN_OR_RETURN(slot.io, device_pool.Acquire(io_bytes, what));
  ASSIGN_OR_RETURN(slot.x0, device_pool.Acquire(x_bytes, what));
  ASSIGN_OR_RETURN(slot.x1, device_pool.Acquire(x_bytes, what));
  ASSIGN_OR_RETURN(slot.a, device_pool.Acquire(mm_bytes, what));
  ASSIGN_OR_RETURN(slot.b, device_pool.Acquire(mm_bytes, what));
  ASSIGN_OR_RETURN(slot.pinned_in, pinned_pool.Acquire(in_bytes, what));
  ASSIGN_OR_RETURN(slot.pinned_out, pinned_pool.Acquire(out_bytes, what));

  // Upload on the copy stream; the host copy into pinned memory overlaps the previous task's
  // compute, which is already enqueued.
  std::memcpy(slot.pinned_in.data(), task.in, in_bytes);
  RETURN_IF_ERROR(
      CudaCall(cudaMemcpyAsync(slot.io.data(), slot.pinned_in.data(), in_bytes, cudaMemcpyHostToDevice, ctx.h2d.get()),
               "cudaMemcpyAsync(H2D)"));
  RETURN_IF_ERROR(CudaCall(cudaEventRecord(slot.uploaded.get(), ctx.h2d.get()), "cudaEventRecord"));
  RETURN_IF_ERROR(CudaCall(cudaStreamWaitEvent(ctx.compute.get(), slot.uploaded.get(), 0), "cudaStreamWaitEvent"));

  cudaStream_t s = ctx.compute.get();
  RETURN_IF_ERROR(
      CudaCall(cuda::SumSquares(task.in_dtype, slot.io.data(), numel, ctx.sumsq_scratch(), ctx.device_scalar(0), s),
               "SumSquares"));
  if (TakeInjectedFailure()) {
    RETURN_IF_ERROR(CudaCall(cuda::LaunchInvalidConfigForTest(s), "Normalize"));
  }
  RETURN_IF_ERROR(
      CudaCall(cuda::Normalize(task.in_dtype, slot.io.data(), numel, ctx.device_scalar(0), static_cast<float>(args.eps),
                               args.eps_mode == EpsMode::kAdd, prec.dtype, slot.x0.data(), s),
               "Normalize"));
  cuda::NsDevice dev{ctx.blas.get(), s, prec};
  ASSIGN_OR_RETURN(void* result, cuda::RunSchedule(dev, args.schedule, cuda::WorkMatrix{slot.x0.data(), is_x, m, n},
                                                   slot.x1.data(), slot.a.data(), slot.b.data()));
  RETURN_IF_ERROR(CudaCall(
      cuda::ScaleConvert(prec.dtype, result, numel, static_cast<float>(args.scale), task.out_dtype, slot.io.data(), s),
      "ScaleConvert"));
  RETURN_IF_ERROR(CudaCall(cudaEventRecord(slot.computed.get(), s), "cudaEventRecord"));

  RETURN_IF_ERROR(CudaCall(cudaStreamWaitEvent(ctx.d2h.get(), slot.computed.get(), 0), "cudaStreamWaitEvent"));
  RETURN_IF_ERROR(CudaCall(
      cudaMemcpyAsync(slot.pinned_out.data(), slot.io.data(), out_bytes, cudaMemcpyDeviceToHost, ctx.d2h.get()),
      "cudaMemcpyAsync(D2H)"));
  return CudaCall(cudaEventRecord(slot.downloaded.get(), ctx.d2h.get()), "cudaEventRecord");
}

absl::Status CudaBackend::Impl::Finish(cuda::Slot& slot) {
  absl::Status status = CudaCall(cudaEventSynchronize(slot.downloaded.get()), "cudaEventSynchronize");
  if (status.ok()) {
    const size_t out_bytes = static_cast<size_t>(slot.task->shape.numel()) * ElementSize(slot.task->out_dtype);
    std::memcpy(slot.task->out, slot.pinned_out.data(), out_bytes);
  }
  slot.Clear();
  return status;
}

std::vector<absl::Status> CudaBackend::Impl::Run(absl::Span<const NsTask> tasks) {
  std::vector<absl::Status> results(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) results[i] = CheckTask(tasks[i]);
  auto lease = Take();
  if (!lease.ok()) {
    for (absl::Status& r : results) {
      if (r.ok()) r = lease.status();
    }
    return results;
  }
  cuda::Context& ctx = ***lease;
  cuda::Slot* pending = nullptr;  // The previous task, still in flight.
  int next_slot = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!results[i].ok()) continue;
    cuda::Slot& slot = ctx.slots[next_slot];
    absl::Status status = Enqueue(ctx, slot, i, tasks[i]);
    if (absl::IsResourceExhausted(status) && pending != nullptr) {
      // The previous task's memory may be what is missing: finish it, then try once more.
      ctx.SyncAll();
      slot.Clear();
      results[pending->index] = Finish(*pending);
      pending = nullptr;
      status = Enqueue(ctx, slot, i, tasks[i]);
    }
    if (!status.ok()) {
      // Nothing of this task may still run when its memory goes back to the pool.
      ctx.SyncAll();
      slot.Clear();
      results[i] = status;
      continue;
    }
    if (pending != nullptr) results[pending->index] = Finish(*pending);
    pending = &slot;
    next_slot ^= 1;
  }
  if (pending != nullptr) results[pending->index] = Finish(*pending);
  return results;
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const Options& options) {
  if (options.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes = ", options.memory_budget_bytes, " must be >= 0 (0 = 90% of free memory)"));
  }
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::FailedPreconditionError("no usable CUDA device: cudaGetDeviceCount reports 0 devices");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", options.device, " is out of range: this machine has ", count, " CUDA device(s)"));
  }
  RETURN_IF_ERROR(CudaCall(cudaSetDevice(options.device), "cudaSetDevice"));
  cudaDeviceProp prop;
  RETURN_IF_ERROR(CudaCall(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties"));
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_ERROR(CudaCall(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const int64_t budget = options.memory_budget_bytes > 0 ? options.memory_budget_bytes
                                                         : static_cast<int64_t>(static_cast<double>(free_bytes) * 0.9);
  // Memory in GiB (an H200's 143,771 MiB shows as "140 GiB"; the marketed "141 GB" is neither unit).
  std::string name = absl::StrFormat("%s (device %d, %.0f GiB)", prop.name, options.device,
                                     std::round(static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0)));
  auto impl = std::make_unique<Impl>(options.device, std::move(name), budget, options.pinned_cache_bytes);
  {
    // Surface stream / cuBLAS failures now rather than on the first task.
    ASSIGN_OR_RETURN(auto lease, impl->Take());
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

BackendInfo CudaBackend::Info() const { return BackendInfo{"cuda", impl_->device_name, impl_->budget}; }

std::vector<absl::Status> CudaBackend::Run(absl::Span<const NsTask> tasks) { return impl_->Run(tasks); }

absl::Status CudaBackend::RunSharded(const NsShardedTask& task, SumReducer& reducer) {
  return impl_->RunSharded(task, reducer);
}

int64_t CudaBackend::DeviceBytesHeld() const { return impl_->device_pool.held_bytes(); }

void CudaBackend::InjectLaunchFailuresForTest(int count) { impl_->injected_failures.store(count); }

}  // namespace orthoserve
