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
};

// Runs every matrix; returns the batch result (one status per matrix) or the batch error.
absl::StatusOr<BatchResult> RunLocalBatch(std::vector<LocalMatrix> matrices, Backend& backend);

}  // namespace orthoserve
