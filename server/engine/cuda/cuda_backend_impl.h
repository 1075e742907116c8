// CudaBackend::Impl: the state behind the pimpl of server/engine/cuda/cuda_backend.h (device,
// pools, pooled contexts). Internal to server/engine/cuda.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/cuda/context.h"
#include "server/engine/cuda/cuda_backend.h"
#include "server/engine/cuda/memory_pool.h"

namespace orthoserve {

class CudaBackend::Impl {
 public:
  Impl(int device, std::string device_name, int64_t budget, int64_t pinned_cache);

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

  const int device;
  const std::string device_name;
  const int64_t budget;
  std::atomic<int> injected_failures{0};
  cuda::MemoryPool device_pool;
  cuda::MemoryPool pinned_pool;

 private:
  void Return(std::unique_ptr<cuda::Context> ctx);

  // Enqueues task `index` into `slot`: staging, upload, NS, download.
  absl::Status Enqueue(cuda::Context& ctx, cuda::Slot& slot, size_t index, const NsTask& task);
  // Waits for the slot's download, copies the result out and frees the slot.
  absl::Status Finish(cuda::Slot& slot);

  absl::Mutex mu_;
  std::vector<std::unique_ptr<cuda::Context>> free_ ABSL_GUARDED_BY(mu_);  // Destroyed before the pools.
};

// INVALID_ARGUMENT unless the task's pointers, shape and args are usable.
absl::Status CheckTask(const NsTask& task);

}  // namespace orthoserve
