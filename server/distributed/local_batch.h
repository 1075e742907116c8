// Running matrices of a lone client on this rank alone: a one-trainer, one-rank plan executed
// by the same ExecuteBatch the fleet uses (over LocalCollective), so every algorithm means on
// one rank exactly what it means on a fleet.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "server/distributed/batch.h"
#include "server/engine/backend.h"

namespace orthoserve {

struct LocalMatrix {
  MatrixPlan plan;           // Without placements; its block is the whole matrix or `block`.
  Block block;               // The lone client's block: the whole matrix (a W = 1 group must tile it).
  const void* in = nullptr;  // block.numel() elements of plan.dtype.
  void* out = nullptr;       // block.numel() elements of plan.result_dtype.
  MemorySpace in_space = MemorySpace::kHost;   // Where `in` is: host, or the backend's device memory.
  MemorySpace out_space = MemorySpace::kHost;  // Where `out` is.
};

// Runs every matrix; returns the batch result (one status per matrix) or the batch error.
//
// When any buffer is in device memory (a CUDA IPC region), the whole batch runs in the backend's
// device memory (a LocalCollective over it): buffers there are computed where they are, and a
// host side of such a batch is staged through a device buffer (its input up once, its result
// down once). FAILED_PRECONDITION when a buffer is in device memory and the backend computes in
// host memory; the backend's Memory errors (RESOURCE_EXHAUSTED, INTERNAL) for the staging.
absl::StatusOr<BatchResult> RunLocalBatch(std::vector<LocalMatrix> matrices, Backend& backend);

}  // namespace orthoserve
