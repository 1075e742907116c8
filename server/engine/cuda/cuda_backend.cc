// Implementation of server/engine/cuda/cuda_backend.h: creation, info and the pipelined Run.
#include "server/engine/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "server/engine/cuda/cuda_backend_impl.h"
#include "server/engine/cuda/cuda_status.h"
#include "server/engine/cuda/kernels.h"
#include "server/engine/cuda/ns_steps.h"

namespace orthoserve {

using cuda::CudaCall;

CudaBackend::Impl::Impl(int device_in, std::string name, std::string uuid, int64_t budget_in,
                        const CudaBackend::Options& options)
    : device(device_in),
      device_name(std::move(name)),
      budget(budget_in),
      cuda_graphs(options.cuda_graphs),
      symmetric_min_size(options.symmetric_min_size),
      device_pool(cuda::MemoryPool::Options{cuda::MemoryPool::Kind::kDevice, budget_in, 0}),
      pinned_pool(cuda::MemoryPool::Options{cuda::MemoryPool::Kind::kPinnedHost, 0, options.pinned_cache_bytes}),
      ipc(device_in, std::move(uuid)) {}

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

namespace {

// Per-task sizes of a task's buffers.
struct TaskSizes {
  int64_t numel, m, n;
  bool is_x;
  size_t in_bytes, out_bytes, io_bytes, x_bytes, mm_bytes;
};

TaskSizes SizesOf(const NsTask& task) {
  const cuda::GemmPrecision prec = cuda::ForPrecision(task.args->precision);
  TaskSizes z;
  z.numel = task.shape.rows * task.shape.cols;
  z.is_x = task.args->transpose;  // The row-major buffer read column-major is Gᵀ: X itself when transposing.
  z.m = z.is_x ? task.shape.cols : task.shape.rows;
  z.n = z.is_x ? task.shape.rows : task.shape.cols;
  z.in_bytes = static_cast<size_t>(z.numel) * ElementSize(task.in_dtype);
  z.out_bytes = static_cast<size_t>(z.numel) * ElementSize(task.out_dtype);
  z.io_bytes = std::max(z.in_bytes, z.out_bytes);
  z.x_bytes = static_cast<size_t>(z.numel) * prec.element_size();
  z.mm_bytes = static_cast<size_t>(z.m * z.m) * prec.element_size();
  return z;
}

size_t NormsBytes(const TaskSizes& z, int64_t count) {
  return static_cast<size_t>(cuda::SumSquaresScratch(z.numel, count) + count) * sizeof(double);
}

bool SameArgs(const NsKernelArgs& x, const NsKernelArgs& y) {
  return &x == &y || (x.schedule == y.schedule && x.precision == y.precision && x.eps == y.eps &&
                      x.eps_mode == y.eps_mode && x.normalization == y.normalization && x.transpose == y.transpose && x.scale == y.scale);
}

bool SameGroup(const NsTask& x, const NsTask& y) {
  return x.shape.rows == y.shape.rows && x.shape.cols == y.shape.cols && x.in_dtype == y.in_dtype &&
         x.out_dtype == y.out_dtype && x.space == y.space && SameArgs(*x.args, *y.args);
}

}  // namespace

int64_t GroupBytes(const NsTask& task, int64_t count) {
  using Pool = cuda::MemoryPool;
  const TaskSizes z = SizesOf(task);
  const size_t c = static_cast<size_t>(count);
  return static_cast<int64_t>(Pool::RoundUp(c * z.io_bytes) + 2 * Pool::RoundUp(c * z.x_bytes) +
                              2 * Pool::RoundUp(c * z.mm_bytes) + Pool::RoundUp(NormsBytes(z, count)));
}

std::vector<std::vector<size_t>> GroupTasks(absl::Span<const NsTask> tasks, const std::vector<absl::Status>& statuses,
                                            int64_t max_group_bytes) {
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!statuses[i].ok()) continue;
    const int64_t numel = tasks[i].shape.numel();
    bool placed = false;
    for (std::vector<size_t>& g : groups) {
      const int64_t count = static_cast<int64_t>(g.size()) + 1;
      if (SameGroup(tasks[g.front()], tasks[i]) && count <= CudaBackend::kMaxGroup &&
          count * numel <= CudaBackend::kMaxGroupElements && GroupBytes(tasks[i], count) <= max_group_bytes) {
        g.push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({i});
  }
  return groups;
}

absl::StatusOr<void*> CudaBackend::Impl::Steps(cuda::Context& ctx, const cuda::BlasDevice& dev,
                                               const NsKernelArgs& args, const cuda::WorkMatrix& x, void* x1, void* a,
                                               void* b) {
  if (!cuda_graphs || args.schedule.empty()) return cuda::RunSchedule(dev, args.schedule, x, x1, a, b);
  // Everything the captured calls depend on: buffers, shape, batch, precision, strips, coefficients.
  cuda::StepGraphs::Key key{reinterpret_cast<int64_t>(x.data),
                            reinterpret_cast<int64_t>(x1),
                            reinterpret_cast<int64_t>(a),
                            reinterpret_cast<int64_t>(b),
                            x.is_x,
                            x.m,
                            x.n,
                            x.batch,
                            static_cast<int64_t>(dev.precision.data_type),
                            static_cast<int64_t>(dev.precision.compute),
                            dev.symmetric_min_size};
  for (const CoefficientTriple& t : args.schedule) {
    for (double v : {t.a, t.b, t.c}) key.push_back(absl::bit_cast<int64_t>(v));
  }
  void* result = nullptr;
  const int64_t before = ctx.graphs.captures();
  RETURN_IF_ERROR(ctx.graphs.Run(key, dev.main.stream, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(result, cuda::RunSchedule(dev, args.schedule, x, x1, a, b));
    return absl::OkStatus();
  }));
  graph_captures += ctx.graphs.captures() - before;
  // A replayed graph leaves the result where the captured loop did: after an odd number of
  // steps in x1, else in x.
  return result != nullptr ? result : (args.schedule.size() % 2 == 1 ? x1 : x.data);
}

absl::Status CudaBackend::Impl::Enqueue(cuda::Context& ctx, cuda::Slot& slot, absl::Span<const NsTask> tasks,
                                        const std::vector<size_t>& members) {
  const NsTask& first = tasks[members.front()];
  const NsKernelArgs& args = *first.args;
  const cuda::GemmPrecision prec = cuda::ForPrecision(args.precision);
  const TaskSizes z = SizesOf(first);
  const int64_t count = static_cast<int64_t>(members.size());
  const size_t c = members.size();
  const std::string what =
      count == 1 ? absl::StrCat("task ", members.front(), " (", first.shape.rows, "x", first.shape.cols, ")")
                 : absl::StrCat("group of ", count, " tasks (", first.shape.rows, "x", first.shape.cols, ")");

  const int64_t need = GroupBytes(first, count);
  if (budget > 0 && need > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", need, " bytes of device memory, more than the backend's budget of ", budget, " bytes"));
  }
  slot.members = members;
  ASSIGN_OR_RETURN(slot.io, device_pool.Acquire(c * z.io_bytes, what));
  ASSIGN_OR_RETURN(slot.x0, device_pool.Acquire(c * z.x_bytes, what));
  ASSIGN_OR_RETURN(slot.x1, device_pool.Acquire(c * z.x_bytes, what));
  ASSIGN_OR_RETURN(slot.a, device_pool.Acquire(c * z.mm_bytes, what));
  ASSIGN_OR_RETURN(slot.b, device_pool.Acquire(c * z.mm_bytes, what));
  ASSIGN_OR_RETURN(slot.norms, device_pool.Acquire(NormsBytes(z, count), what));
  const bool on_device = first.space == MemorySpace::kDevice;
  if (on_device) {
    // Tasks in device memory: gathered into the group's batch with one device copy each.
    for (size_t j = 0; j < c; ++j) {
      RETURN_IF_ERROR(Copy(slot.io.as<char>() + j * z.in_bytes, tasks[members[j]].in, z.in_bytes,
                           cudaMemcpyDeviceToDevice, ctx.h2d.get(), "cudaMemcpyAsync(D2D)"));
    }
  } else {
    ASSIGN_OR_RETURN(slot.pinned_in, pinned_pool.Acquire(c * z.in_bytes, what));
    ASSIGN_OR_RETURN(slot.pinned_out, pinned_pool.Acquire(c * z.out_bytes, what));
    // Upload on the copy stream; the host copies into pinned memory overlap the previous group's
    // compute, which is already enqueued.
    for (size_t j = 0; j < c; ++j) {
      std::memcpy(slot.pinned_in.as<char>() + j * z.in_bytes, tasks[members[j]].in, z.in_bytes);
    }
    RETURN_IF_ERROR(Copy(slot.io.data(), slot.pinned_in.data(), c * z.in_bytes, cudaMemcpyHostToDevice,
                         ctx.h2d.get(), "cudaMemcpyAsync(H2D)"));
  }
  RETURN_IF_ERROR(CudaCall(cudaEventRecord(slot.uploaded.get(), ctx.h2d.get()), "cudaEventRecord"));
  RETURN_IF_ERROR(CudaCall(cudaStreamWaitEvent(ctx.compute.get(), slot.uploaded.get(), 0), "cudaStreamWaitEvent"));

  cudaStream_t s = ctx.compute.get();
  double* scratch = slot.norms.as<double>();
  double* sums = scratch + cuda::SumSquaresScratch(z.numel, count);
  const bool bf16_norm = args.normalization == Normalization::kBf16;
  RETURN_IF_ERROR(
      CudaCall(cuda::SumSquares(first.in_dtype, slot.io.data(), z.numel, count, bf16_norm, scratch, sums, s),
               "SumSquares"));
  if (TakeInjectedFailure()) {
    RETURN_IF_ERROR(CudaCall(cuda::LaunchInvalidConfigForTest(s), "Normalize"));
  }
  RETURN_IF_ERROR(CudaCall(cuda::Normalize(first.in_dtype, slot.io.data(), z.numel, count, sums,
                                           args.eps, args.eps_mode == EpsMode::kAdd, bf16_norm, prec.dtype,
                                           slot.x0.data(), s),
                           "Normalize"));
  const cuda::BlasDevice dev = ctx.Blas(prec, symmetric_min_size);
  ASSIGN_OR_RETURN(void* result, Steps(ctx, dev, args, cuda::WorkMatrix{slot.x0.data(), z.is_x, z.m, z.n, count},
                                       slot.x1.data(), slot.a.data(), slot.b.data()));
  RETURN_IF_ERROR(CudaCall(cuda::ScaleConvert(prec.dtype, result, count * z.numel, static_cast<float>(args.scale),
                                              first.out_dtype, slot.io.data(), s),
                           "ScaleConvert"));
  RETURN_IF_ERROR(CudaCall(cudaEventRecord(slot.computed.get(), s), "cudaEventRecord"));

  RETURN_IF_ERROR(CudaCall(cudaStreamWaitEvent(ctx.d2h.get(), slot.computed.get(), 0), "cudaStreamWaitEvent"));
  if (on_device) {
    for (size_t j = 0; j < c; ++j) {
      RETURN_IF_ERROR(Copy(tasks[members[j]].out, slot.io.as<char>() + j * z.out_bytes, z.out_bytes,
                           cudaMemcpyDeviceToDevice, ctx.d2h.get(), "cudaMemcpyAsync(D2D)"));
    }
  } else {
    RETURN_IF_ERROR(Copy(slot.pinned_out.data(), slot.io.data(), c * z.out_bytes, cudaMemcpyDeviceToHost,
                         ctx.d2h.get(), "cudaMemcpyAsync(D2H)"));
  }
  return CudaCall(cudaEventRecord(slot.downloaded.get(), ctx.d2h.get()), "cudaEventRecord");
}

void CudaBackend::Impl::Finish(cuda::Slot& slot, absl::Span<const NsTask> tasks, std::vector<absl::Status>& results) {
  const absl::Status status = CudaCall(cudaEventSynchronize(slot.downloaded.get()), "cudaEventSynchronize");
  for (size_t j = 0; j < slot.members.size(); ++j) {
    const NsTask& task = tasks[slot.members[j]];
    const size_t out_bytes = static_cast<size_t>(task.shape.numel()) * ElementSize(task.out_dtype);
    if (status.ok() && task.space == MemorySpace::kHost) {
      std::memcpy(task.out, slot.pinned_out.as<char>() + j * out_bytes, out_bytes);
    }
    results[slot.members[j]] = status;
  }
  slot.Clear();
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
  cudaGetLastError();  // An error an earlier call left on this thread is not this call's.
  // A group may take a quarter of the budget, so the pipeline's two slots fit with room to spare.
  const int64_t max_group_bytes = budget > 0 ? std::min<int64_t>(budget / 4, int64_t{1} << 30) : int64_t{1} << 30;
  const std::vector<std::vector<size_t>> groups = GroupTasks(tasks, results, max_group_bytes);
  std::deque<std::vector<size_t>> queue(groups.begin(), groups.end());
  cuda::Slot* pending = nullptr;  // The previous group, still in flight.
  int next_slot = 0;
  while (!queue.empty()) {
    const std::vector<size_t> members = std::move(queue.front());
    queue.pop_front();
    cuda::Slot& slot = ctx.slots[next_slot];
    absl::Status status = Enqueue(ctx, slot, tasks, members);
    if (absl::IsResourceExhausted(status) && pending != nullptr) {
      // The previous group's memory may be what is missing: finish it, then try once more.
      ctx.SyncAll();
      slot.Clear();
      Finish(*pending, tasks, results);
      pending = nullptr;
      status = Enqueue(ctx, slot, tasks, members);
    }
    if (absl::IsResourceExhausted(status) && members.size() > 1) {
      // Too large together: run the members one at a time instead.
      ctx.SyncAll();
      slot.Clear();
      for (auto it = members.rbegin(); it != members.rend(); ++it) queue.push_front({*it});
      continue;
    }
    if (!status.ok()) {
      // Nothing of this group may still run when its memory goes back to the pool.
      ctx.SyncAll();
      slot.Clear();
      for (size_t m : members) results[m] = status;
      continue;
    }
    if (pending != nullptr) Finish(*pending, tasks, results);
    pending = &slot;
    next_slot ^= 1;
  }
  if (pending != nullptr) Finish(*pending, tasks, results);
  return results;
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const Options& options) {
  if (options.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes = ", options.memory_budget_bytes, " must be >= 0 (0 = 90% of free memory)"));
  }
  if (options.symmetric_min_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("symmetric_min_size = ", options.symmetric_min_size, " must be >= 1"));
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
  unsigned char uuid[16];
  std::memcpy(uuid, prop.uuid.bytes, sizeof(uuid));
  auto impl = std::make_unique<Impl>(options.device, std::move(name), FormatGpuUuid(uuid), budget, options);
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

int64_t CudaBackend::DeviceMemoryInUseBytes() const { return impl_->device_pool.in_use_bytes(); }

int64_t CudaBackend::GraphCaptures() const { return impl_->graph_captures.load(); }

CopyCounts CudaBackend::Copies() const { return impl_->Copies(); }

Memory& CudaBackend::memory() { return impl_->memory; }

IpcOpener* CudaBackend::ipc_opener() { return &impl_->ipc; }

absl::Status CudaBackend::Impl::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                     cudaStream_t stream, const char* what) {
  RETURN_IF_ERROR(CudaCall(cudaMemcpyAsync(dst, src, bytes, kind, stream), what));
  Count(kind, bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                       size_t row_bytes, size_t rows, cudaMemcpyKind kind, cudaStream_t stream,
                                       const char* what) {
  RETURN_IF_ERROR(CudaCall(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, kind, stream), what));
  Count(kind, rows * row_bytes);
  return absl::OkStatus();
}

void CudaBackend::Impl::Count(cudaMemcpyKind kind, size_t bytes) {
  const auto n = static_cast<int64_t>(bytes);
  if (kind == cudaMemcpyHostToDevice) {
    h2d_bytes += n;
    ++h2d_calls;
  } else if (kind == cudaMemcpyDeviceToHost) {
    d2h_bytes += n;
    ++d2h_calls;
  } else if (kind == cudaMemcpyDeviceToDevice) {
    d2d_bytes += n;
    ++d2d_calls;
  }
}

CopyCounts CudaBackend::Impl::Copies() const {
  CopyCounts c;
  c.h2d_bytes = h2d_bytes.load();
  c.h2d_calls = h2d_calls.load();
  c.d2h_bytes = d2h_bytes.load();
  c.d2h_calls = d2h_calls.load();
  c.d2d_bytes = d2d_bytes.load();
  c.d2d_calls = d2d_calls.load();
  return c;
}

void CudaBackend::InjectLaunchFailuresForTest(int count) { impl_->injected_failures.store(count); }

}  // namespace orthoserve
