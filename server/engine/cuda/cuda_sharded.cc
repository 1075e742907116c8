// CudaBackend::RunSharded: one participant of TP_DISTRIBUTED Newton–Schulz on the GPU. When the
// reducer takes device memory (NCCL), the norm's sum of squares (one double) and each step's Gram
// are reduced where they were computed; otherwise both go down to pinned host memory and back up
// around the reduction. Shards in host memory are uploaded once and downloaded once; shards in
// device memory are read and written where they are. Everything else stays on the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engine/cuda/cuda_backend_impl.h"
#include "server/engine/cuda/cuda_status.h"
#include "server/engine/cuda/kernels.h"
#include "server/engine/cuda/ns_steps.h"

namespace orthoserve {
namespace {

using cuda::CudaCall;

struct DeviceShard {
  const NsShard* shard = nullptr;
  cuda::WorkMatrix x;     // The shard's X_i (m × n_i) in the layout of ns_steps.h.
  const void* in = nullptr;  // The shard's input on the device: io, or the shard's own buffer.
  void* out = nullptr;       // Where its result goes on the device: io, or the shard's own buffer.
  cuda::MemoryPool::Block io, x0, x1, pinned;
};

absl::Status CheckShardedTask(const NsShardedTask& task) {
  if (task.args == nullptr) return absl::InvalidArgumentError("sharded task has no args");
  if (task.partition_dim != 0 && task.partition_dim != 1) {
    return absl::InvalidArgumentError(absl::StrCat("partition_dim = ", task.partition_dim, " must be 0 or 1"));
  }
  if (task.gram_size <= 0) return absl::InvalidArgumentError(absl::StrCat("gram_size = ", task.gram_size));
  for (size_t i = 0; i < task.shards.size(); ++i) {
    const NsShard& s = task.shards[i];
    if (s.in == nullptr || s.out == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", i, " has a null input or output"));
    }
    const int64_t whole = task.partition_dim == 0 ? s.shape.cols : s.shape.rows;
    if (s.shape.rows <= 0 || s.shape.cols <= 0 || whole != task.gram_size) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", i, " shape ", s.shape.rows, "x", s.shape.cols,
                                                     " does not span the unsharded dim of ", task.gram_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaBackend::Impl::RunSharded(const NsShardedTask& task, SumReducer& reducer) {
  RETURN_IF_ERROR(CheckShardedTask(task));
  const NsKernelArgs& args = *task.args;
  const cuda::GemmPrecision prec = cuda::ForPrecision(args.precision);
  const int64_t m = task.gram_size;
  const size_t mm = static_cast<size_t>(m * m);
  ASSIGN_OR_RETURN(auto lease, Take());
  cuda::Context& ctx = **lease;
  cudaStream_t s = ctx.compute.get();
  const cuda::BlasDevice dev = ctx.Blas(prec, symmetric_min_size);

  std::vector<DeviceShard> shards(task.shards.size());
  cuda::MemoryPool::Block a, b, gram, pinned_gram, norms;
  // Whatever happens below, no kernel may still use the blocks when they go back to the pools.
  struct SyncOnExit {
    cuda::Context& ctx;
    ~SyncOnExit() { ctx.SyncAll(); }
  } sync_on_exit{ctx};

  // Upload every shard. partition_dim 0: a shard is r_i × m rows of G, X_i = G_iᵀ, and its
  // row-major buffer read column-major is exactly X_i. partition_dim 1: X_i = G_i (m × c_i),
  // held as X_iᵀ.
  for (size_t i = 0; i < shards.size(); ++i) {
    const NsShard& src = task.shards[i];
    DeviceShard& d = shards[i];
    d.shard = &src;
    const int64_t numel = src.shape.numel();
    const std::string what = absl::StrCat("shard ", i, " (", src.shape.rows, "x", src.shape.cols, ")");
    const size_t in_bytes = static_cast<size_t>(numel) * ElementSize(src.in_dtype);
    const size_t out_bytes = static_cast<size_t>(numel) * ElementSize(src.out_dtype);
    ASSIGN_OR_RETURN(d.x0, device_pool.Acquire(static_cast<size_t>(numel) * prec.element_size(), what));
    ASSIGN_OR_RETURN(d.x1, device_pool.Acquire(static_cast<size_t>(numel) * prec.element_size(), what));
    const bool is_x = task.partition_dim == 0;
    d.x = cuda::WorkMatrix{d.x0.data(), is_x, m, is_x ? src.shape.rows : src.shape.cols};
    if (src.space == MemorySpace::kDevice) {
      d.in = src.in;
      d.out = src.out;
      continue;
    }
    ASSIGN_OR_RETURN(d.io, device_pool.Acquire(std::max(in_bytes, out_bytes), what));
    ASSIGN_OR_RETURN(d.pinned, pinned_pool.Acquire(std::max(in_bytes, out_bytes), what));
    d.in = d.io.data();
    d.out = d.io.data();
    std::memcpy(d.pinned.data(), src.in, in_bytes);
    RETURN_IF_ERROR(Copy(d.io.data(), d.pinned.data(), in_bytes, cudaMemcpyHostToDevice, s, "cudaMemcpyAsync"));
  }
  ASSIGN_OR_RETURN(a, device_pool.Acquire(mm * prec.element_size(), "Gram"));
  ASSIGN_OR_RETURN(b, device_pool.Acquire(mm * prec.element_size(), "Gram"));
  ASSIGN_OR_RETURN(gram, device_pool.Acquire(mm * sizeof(float), "Gram sum"));
  const bool on_device = reducer.ReducesDeviceMemory();
  if (!on_device) {
    ASSIGN_OR_RETURN(pinned_gram, pinned_pool.Acquire(mm * sizeof(float), "Gram sum"));
  }

  // Norm: the local sum of squares (shards in order), all-reduced in double.
  const bool bf16_norm = args.normalization == Normalization::kBf16;
  const double* sumsq_device = ctx.device_scalar(1);
  if (on_device) {
    // Each shard's sum, then their sum in shard order, reduced where it is.
    ASSIGN_OR_RETURN(norms, device_pool.Acquire((shards.size() + 1) * sizeof(double), "norms"));
    double* sums = norms.as<double>();
    for (size_t i = 0; i < shards.size(); ++i) {
      RETURN_IF_ERROR(CudaCall(cuda::SumSquares(shards[i].shard->in_dtype, shards[i].in, shards[i].shard->shape.numel(),
                                                1, bf16_norm, ctx.sumsq_scratch(), sums + i, s),
                               "SumSquares"));
    }
    double* total = sums + shards.size();
    RETURN_IF_ERROR(CudaCall(cuda::SumInOrder(sums, static_cast<int64_t>(shards.size()), total, s), "SumInOrder"));
    RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
    RETURN_IF_ERROR(reducer.AllReduceSum(absl::MakeSpan(total, 1)));
    sumsq_device = total;
  } else {
    double sumsq = 0;
    for (DeviceShard& d : shards) {
      RETURN_IF_ERROR(CudaCall(cuda::SumSquares(d.shard->in_dtype, d.in, d.shard->shape.numel(), 1, bf16_norm,
                                                ctx.sumsq_scratch(), ctx.device_scalar(0), s),
                               "SumSquares"));
      RETURN_IF_ERROR(Copy(ctx.host_scalar(0), ctx.device_scalar(0), sizeof(double), cudaMemcpyDeviceToHost, s,
                           "cudaMemcpyAsync"));
      RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      sumsq += *ctx.host_scalar(0);
    }
    RETURN_IF_ERROR(reducer.AllReduceSum(absl::MakeSpan(&sumsq, 1)));
    *ctx.host_scalar(1) = sumsq;
    RETURN_IF_ERROR(Copy(ctx.device_scalar(1), ctx.host_scalar(1), sizeof(double), cudaMemcpyHostToDevice, s,
                         "cudaMemcpyAsync"));
  }
  for (DeviceShard& d : shards) {
    if (TakeInjectedFailure()) RETURN_IF_ERROR(CudaCall(cuda::LaunchInvalidConfigForTest(s), "Normalize"));
    RETURN_IF_ERROR(CudaCall(cuda::Normalize(d.shard->in_dtype, d.in, d.shard->shape.numel(), 1, sumsq_device,
                                             args.eps, args.eps_mode == EpsMode::kAdd, bf16_norm, prec.dtype,
                                             d.x0.data(), s),
                             "Normalize"));
  }

  float* host_gram = on_device ? nullptr : pinned_gram.as<float>();
  for (const CoefficientTriple& t : args.schedule) {
    // Local Gram: each shard's X_i·X_iᵀ in the working precision (bf16-rounded in MEDIUM),
    // summed in fp32 in shard order; zeros for a participant without shards.
    if (shards.empty()) {
      RETURN_IF_ERROR(CudaCall(cudaMemsetAsync(gram.data(), 0, mm * sizeof(float), s), "cudaMemsetAsync"));
    }
    for (size_t i = 0; i < shards.size(); ++i) {
      RETURN_IF_ERROR(cuda::Gram(dev, shards[i].x, b.data()));
      RETURN_IF_ERROR(
          CudaCall(cuda::AccumulateF32(prec.dtype, b.data(), static_cast<int64_t>(mm), gram.as<float>(), i == 0, s),
                   "AccumulateF32"));
    }
    if (on_device) {
      // The reducer (NCCL) sums the Gram where it is: complete before the call, summed after it.
      RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      RETURN_IF_ERROR(reducer.AllReduceSum(absl::MakeSpan(gram.as<float>(), mm)));
    } else {
      RETURN_IF_ERROR(Copy(host_gram, gram.data(), mm * sizeof(float), cudaMemcpyDeviceToHost, s, "cudaMemcpyAsync"));
      RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      RETURN_IF_ERROR(reducer.AllReduceSum(absl::MakeSpan(host_gram, mm)));
      RETURN_IF_ERROR(Copy(gram.data(), host_gram, mm * sizeof(float), cudaMemcpyHostToDevice, s, "cudaMemcpyAsync"));
    }
    // A = the summed Gram in the working precision (rounded to bf16 once in MEDIUM).
    RETURN_IF_ERROR(
        CudaCall(cuda::ScaleConvert(DType::kF32, gram.data(), static_cast<int64_t>(mm), 1.0f, prec.dtype, a.data(), s),
                 "ScaleConvert"));
    // B depends on the summed Gram only: made once per step, applied to every local shard.
    ASSIGN_OR_RETURN(const cuda::Multiplier mult, cuda::MakeMultiplier(dev, t, a.data(), b.data(), m, 1));
    for (DeviceShard& d : shards) {
      void* next = d.x.data == d.x0.data() ? d.x1.data() : d.x0.data();
      RETURN_IF_ERROR(cuda::ApplyMultiplier(dev, t, mult, d.x, next));
      d.x.data = next;
    }
  }

  for (DeviceShard& d : shards) {
    const int64_t numel = d.shard->shape.numel();
    const size_t out_bytes = static_cast<size_t>(numel) * ElementSize(d.shard->out_dtype);
    RETURN_IF_ERROR(CudaCall(cuda::ScaleConvert(prec.dtype, d.x.data, numel, static_cast<float>(args.scale),
                                                d.shard->out_dtype, d.out, s),
                             "ScaleConvert"));
    if (d.shard->space == MemorySpace::kHost) {
      RETURN_IF_ERROR(Copy(d.pinned.data(), d.io.data(), out_bytes, cudaMemcpyDeviceToHost, s, "cudaMemcpyAsync"));
    }
  }
  RETURN_IF_ERROR(CudaCall(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
  for (DeviceShard& d : shards) {
    if (d.shard->space == MemorySpace::kDevice) continue;
    std::memcpy(d.shard->out, d.pinned.data(),
                static_cast<size_t>(d.shard->shape.numel()) * ElementSize(d.shard->out_dtype));
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
