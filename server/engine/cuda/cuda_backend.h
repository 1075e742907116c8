// CudaBackend: the Backend of server/engine/backend.h on one NVIDIA GPU (cuBLAS + our kernels).
// This header includes no CUDA header (the implementation is behind a pimpl), so code built
// without the CUDA toolkit's include paths may include it.
//
// Contract (beyond backend.h). Create returns FAILED_PRECONDITION when the machine has no usable
// CUDA device or driver, INVALID_ARGUMENT for a device ordinal out of range or a negative budget.
// Device memory comes from a caching pool bounded by `memory_budget_bytes`; a task that does not
// fit gets RESOURCE_EXHAUSTED and later tasks run normally. Tasks of one Run call are pipelined:
// task i+1 is uploaded while task i computes and task i−1 downloads. Results depend only on the
// task (never on the batch it arrives in): each task runs on its own with a fixed sequence of
// cuBLAS calls chosen from its shape and precision. Thread-safe: concurrent calls each take
// their own streams and cuBLAS handle from a pool and share the memory pools.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/engine/backend.h"

namespace orthoserve {

class CudaBackend final : public Backend {
 public:
  struct Options {
    int device = 0;                   // CUDA device ordinal.
    int64_t memory_budget_bytes = 0;  // Device bytes the pool may hold; 0 = 90% of the free memory at start.
    int64_t pinned_cache_bytes = int64_t{1} << 30;  // Pinned host staging kept for reuse.
  };

  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const Options& options);
  ~CudaBackend() override;

  BackendInfo Info() const override;
  std::vector<absl::Status> Run(absl::Span<const NsTask> tasks) override;
  absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer) override;

  // Bytes of device memory the pool holds now (in use + cached).
  int64_t DeviceBytesHeld() const;

  // Test hook: the next `count` tasks launch their normalization kernel with an invalid
  // configuration, so the task fails with INTERNAL "...cudaErrorInvalidConfiguration...".
  void InjectLaunchFailuresForTest(int count);

  class Impl;

 private:
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orthoserve
