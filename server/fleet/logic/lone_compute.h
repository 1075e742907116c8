// Computing one lone client's matrix on this rank: what a lone step does with a matrix it keeps
// (server/step) and what the Peer service does with one forwarded to it (peer.h), so that the
// two give the same bits through the same code.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/backend.h"
#include "server/metrics/metrics.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

struct LoneComputation {
  absl::Status status;  // The matrix's: OK, or why it failed (the output is then unspecified).
  absl::Duration compute_time;
  double flops = 0;
};

// Orthogonalizes `plan` (without placements) whose block `block` (the whole matrix) is `in`
// (block.numel() elements of plan.dtype) into `out` (block.numel() elements of
// plan.result_dtype), on this rank alone: a one-trainer, one-rank batch through ExecuteBatch
// (RunLocalBatch), so every algorithm means what it means on a fleet. `in_space` and
// `out_space` say where `in` and `out` are: host memory, or the backend's device memory (a CUDA
// IPC region: computed there, RunLocalBatch). Records the compute time and FLOPs in `metrics`
// (may be null) under `tenant`.
LoneComputation ComputeLoneMatrix(const MatrixPlan& plan, const Block& block, const void* in, void* out,
                                  Backend& backend, Metrics* metrics, const std::string& tenant,
                                  MemorySpace in_space = MemorySpace::kHost,
                                  MemorySpace out_space = MemorySpace::kHost);

}  // namespace orthoserve
