// CudaBackend: the Backend of server/engine/backend.h on one NVIDIA GPU (cuBLAS + our kernels).
// This header includes no CUDA header (the implementation is behind a pimpl), so code built
// without the CUDA toolkit's include paths may include it.
//
// Contract (beyond backend.h). Create returns FAILED_PRECONDITION when the machine has no usable
// CUDA device or driver, INVALID_ARGUMENT for a device ordinal out of range or a negative budget.
// Device memory comes from a caching pool bounded by `memory_budget_bytes`; a task that does not
// fit gets RESOURCE_EXHAUSTED and later tasks run normally. Tasks of one Run call with the same
// shape, dtypes and kernel arguments are grouped (up to kMaxGroup tasks, kMaxGroupElements
// elements in all) and run as one strided batch; groups are pipelined: group i+1 is uploaded
// while group i computes and group i−1 downloads. A device failure inside a group fails each of
// its tasks with the same status. Results depend only on the task, never on the batch or group it
// arrives in: the call sequence follows from its shape and precision, and every product uses the
// algorithm chosen for one instance whatever the group size (lt_gemm.h). Thread-safe: concurrent
// calls each take their own streams, cuBLASLt state and graphs from a pool and share the memory
// pools.
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
    // Replay each group's step loop as a CUDA graph (captured once per shape and buffers, see
    // step_graphs.h): one launch instead of one per GEMM and kernel. Same results either way.
    bool cuda_graphs = false;
    // Symmetric products (X·Xᵀ, A·A) of matrices with m at least this compute the upper
    // triangle in strips; smaller ones use one full GEMM (products.h).
    int64_t symmetric_min_size = 1024;
  };

  static constexpr int64_t kMaxGroup = 64;
  static constexpr int64_t kMaxGroupElements = int64_t{4} << 20;

  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const Options& options);
  ~CudaBackend() override;

  BackendInfo Info() const override;
  std::vector<absl::Status> Run(absl::Span<const NsTask> tasks) override;
  absl::Status RunSharded(const NsShardedTask& task, SumReducer& reducer) override;

  // Bytes of device memory the pool holds now (in use + cached), and the part tasks use; the
  // per-context cuBLASLt workspaces and scratch are counted in neither.
  int64_t DeviceBytesHeld() const;
  int64_t DeviceMemoryInUseBytes() const override;
  // Every copy the backend enqueued, by direction. Run: one upload and one download per group of
  // host tasks, one device-to-device copy in and one out per task in device memory. RunSharded:
  // each host shard's upload and download; with a host reducer also the norm's two scalars and,
  // every Newton–Schulz step, the Gram matrix down and back up around the reduction (a reducer of
  // device memory needs none of them). memory(): each of its copies.
  CopyCounts Copies() const override;

  // Device memory (server/engine/memory.h): buffers from the backend's pool, under its budget.
  Memory& memory() override;

  // Opens other processes' allocations from CUDA IPC handles on this backend's device
  // (cuda_ipc.h): the memory of CUDA IPC shared-memory regions, computed on where it is.
  IpcOpener* ipc_opener() override;

  // Step graphs captured so far, over every context (0 without cuda_graphs).
  int64_t GraphCaptures() const;

  // Test hook: the next `count` groups (or sharded tasks) launch their normalization kernel with
  // an invalid configuration, so their tasks fail with INTERNAL "...cudaErrorInvalidConfiguration...".
  void InjectLaunchFailuresForTest(int count);

  class Impl;

 private:
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orthoserve
