// CudaBackend::Impl: the state behind the pimpl of server/engine/cuda/cuda_backend.h (device,
// pools, pooled contexts). Internal to server/engine/cuda.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/cuda/context.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/cuda/cuda_ipc.h"
#include "server/engine/cuda/cuda_memory.h"
#include "server/engine/cuda/memory_pool.h"
#include "server/engine/cuda/ns_steps.h"

namespace orthoserve {

class CudaBackend::Impl {
 public:
  Impl(int device, std::string device_name, std::string device_uuid, int64_t budget,
       const CudaBackend::Options& options);

  // A context taken from the pool (or made) for one call; goes back when destroyed.
  class Lease {
   public:
    Lease(Impl* impl, std::unique_ptr<cuda::Context> ctx) : impl_(impl), ctx_(std::move(ctx)) {}
    ~Lease() { impl_->Return(std::move(ctx_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    cuda::Context& operator*() const { return *ctx_; }
    cuda::Context* operator->() const { return ctx_.get(); }

   private:
    Impl* impl_;
    std::unique_ptr<cuda::Context> ctx_;
  };

  // Makes the device current on the calling thread and leases a context.
  absl::StatusOr<std::unique_ptr<Lease>> Take();

  std::vector<absl::Status> Run(absl::Span<const NsTask> tasks);
  absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer);

  // True (and one injected failure used up) when the next normalization must fail.
  bool TakeInjectedFailure();

  // cudaMemcpyAsync of `bytes` from `src` to `dst` on `stream`, counted in Copies() by `kind`
  // once enqueued; `what` names it in the error.
  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                    const char* what);
  // cudaMemcpy2DAsync of `rows` rows of `row_bytes`, counted as one call of rows·row_bytes bytes.
  absl::Status Copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
                      cudaMemcpyKind kind, cudaStream_t stream, const char* what);
  CopyCounts Copies() const;

  const int device;
  const std::string device_name;
  const int64_t budget;
  const bool cuda_graphs;
  const int64_t symmetric_min_size;
  std::atomic<int> injected_failures{0};
  std::atomic<int64_t> graph_captures{0};
  std::atomic<int64_t> h2d_bytes{0}, h2d_calls{0}, d2h_bytes{0}, d2h_calls{0}, d2d_bytes{0}, d2d_calls{0};
  cuda::MemoryPool device_pool;
  cuda::MemoryPool pinned_pool;
  CudaMemory memory{*this};  // CudaBackend::memory().
  CudaIpcOpener ipc;         // CudaBackend::ipc_opener().

 private:
  void Return(std::unique_ptr<cuda::Context> ctx);
  void Count(cudaMemcpyKind kind, size_t bytes);

  // Enqueues the group `members` of `tasks` into `slot`: staging, upload, NS, download.
  absl::Status Enqueue(cuda::Context& ctx, cuda::Slot& slot, absl::Span<const NsTask> tasks,
                       const std::vector<size_t>& members);
  // Waits for the slot's download, copies the results out, sets each member's status and frees
  // the slot.
  void Finish(cuda::Slot& slot, absl::Span<const NsTask> tasks, std::vector<absl::Status>& results);
  // Enqueues the step loop of `x`, replayed from a graph when cuda_graphs is on.
  absl::StatusOr<void*> Steps(cuda::Context& ctx, const cuda::BlasDevice& dev, const NsKernelArgs& args,
                              const cuda::WorkMatrix& x, void* x1, void* a, void* b);

  absl::Mutex mu_;
  std::vector<std::unique_ptr<cuda::Context>> free_ ABSL_GUARDED_BY(mu_);  // Destroyed before the pools.
};

// INVALID_ARGUMENT unless the task's pointers, shape and args are usable.
absl::Status CheckTask(const NsTask& task);

// Groups the tasks whose status is OK into runs of the same shape, dtypes and kernel arguments
// (in order of first appearance), each within CudaBackend::kMaxGroup tasks, kMaxGroupElements
// elements and `max_group_bytes` of working set (a single task always forms a group).
std::vector<std::vector<size_t>> GroupTasks(absl::Span<const NsTask> tasks, const std::vector<absl::Status>& statuses,
                                            int64_t max_group_bytes);

// Device bytes a group of `count` tasks like `task` needs at once (I/O, two copies of X, A, B and
// the norms' scratch), in pool units.
int64_t GroupBytes(const NsTask& task, int64_t count);

}  // namespace orthoserve
