// Context: what one concurrent caller of the CUDA backend needs of its own — three streams
// (upload, compute, download), a cuBLAS handle on the compute stream, a reduction scratch and
// two pipeline slots with their events. Contexts are pooled by the backend; one thread at a
// time uses a context.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/engine/cuda/cuda_handles.h"
#include "server/engine/cuda/memory_pool.h"

namespace orthoserve::cuda {

// One task in flight through the upload → compute → download pipeline, and its memory.
struct Slot {
  Event uploaded, computed, downloaded;
  size_t index = 0;              // The task's index in the Run call.
  const NsTask* task = nullptr;  // Null when the slot is free.
  MemoryPool::Block pinned_in, pinned_out, io, x0, x1, a, b;

  // Drops the task and returns its memory to the pools. Only once no stream uses it.
  void Clear();
};

struct Context {
  Stream h2d, compute, d2h;
  CublasHandle blas;
  DeviceMemory scratch;       // kSumSquaresScratch + 8 doubles; the last 8 hold scalar results.
  PinnedMemory host_scalars;  // 8 doubles of pinned host memory.
  Slot slots[2];

  static absl::StatusOr<std::unique_ptr<Context>> Create();

  double* sumsq_scratch() const;
  double* device_scalar(int i) const;  // i in [0, 8).
  double* host_scalar(int i) const;

  // Waits for everything enqueued on the three streams; errors are ignored (used on error
  // paths before memory is released).
  void SyncAll();
};

}  // namespace orthoserve::cuda
