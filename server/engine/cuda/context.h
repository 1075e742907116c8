// Context: what one concurrent caller of the CUDA backend needs of its own — three pipeline
// streams (upload, compute, download), side streams the symmetric products fan out to, a
// cuBLASLt instance with its per-stream workspaces, a reduction scratch for the sharded path,
// two pipeline slots with their events, and the caller's cached step graphs. Contexts are
// pooled by the backend; one thread at a time uses a context.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/engine/cuda/cuda_handles.h"
#include "server/engine/cuda/lt_gemm.h"
#include "server/engine/cuda/memory_pool.h"
#include "server/engine/cuda/products.h"
#include "server/engine/cuda/step_graphs.h"

namespace orthoserve::cuda {

// One group of same-shape tasks in flight through the upload → compute → download pipeline,
// and its memory.
struct Slot {
  Event uploaded, computed, downloaded;
  std::vector<size_t> members;  // Indices of the group's tasks in the Run call; empty when free.
  MemoryPool::Block pinned_in, pinned_out, io, x0, x1, a, b, norms;

  // Drops the group and returns its memory to the pools. Only once no stream uses it.
  void Clear();
};

struct Context {
  static constexpr int kSideLanes = 3;                                  // Besides the compute stream.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;           // cuBLASLt workspace per lane.
  // scratch: kSumSquaresMaxScratch doubles for SumSquares of one matrix, then 8 scalar results.

  Stream h2d, compute, d2h;
  Stream side_streams[kSideLanes];
  Event side_done[kSideLanes];
  Event fork;
  std::unique_ptr<LtGemm> lt;
  DeviceMemory workspaces;    // (1 + kSideLanes) × kWorkspaceBytes.
  DeviceMemory scratch;       // SumSquares scratch for one matrix + 8 scalar results.
  PinnedMemory host_scalars;  // 8 doubles of pinned host memory.
  Slot slots[2];
  StepGraphs graphs;

  static absl::StatusOr<std::unique_ptr<Context>> Create();

  // The products' view of this context at `precision`: main lane = the compute stream.
  BlasDevice Blas(const GemmPrecision& precision, int64_t symmetric_min_size) const;

  double* sumsq_scratch() const;       // Scratch for SumSquares of one matrix.
  double* device_scalar(int i) const;  // i in [0, 8).
  double* host_scalar(int i) const;

  // Waits for everything enqueued on every stream of the context and clears the thread's last
  // error; errors are ignored (used on error paths before memory is released).
  void SyncAll();
};

}  // namespace orthoserve::cuda
