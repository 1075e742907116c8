// A batch: the matrices of one (group, step) as the fleet executes it (their description is
// server/plan/matrix_plan.h), and the distributed algorithms of docs/architecture.md that run it
// over a Backend and a Collective. No gRPC here.
//
// Every fleet rank receives the same BatchPlan (from the coordinator log) and calls
// ExecuteBatch with the blocks its own trainer ranks sent. The plan is a pure description, so
// validation and owner choice are deterministic functions of it and agree on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "server/collective/collective.h"
#include "server/engine/backend.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

// Per-matrix validation of a plan, identical on every rank. Returns one status per matrix, OK or
// INVALID_ARGUMENT with a message that starts with `matrix "name"` and names the field:
//  - unless the matrix is `checked` (it passed them where it entered this process), CheckMatrix
//    (server/plan/matrix_checks.h): "algorithm", "dtype", "result_dtype", "view", "options",
//    "nd_layout", "partition_dim";
//  - "options" of the blocks: ValidateNsOptionsForShape of every non-empty block for
//    TP_BLOCKWISE and for TP_DISTRIBUTED with partition_dim 0, whose blocks are split locally;
//  - "owner": AUTO only, -1 (not assigned yet) or a fleet rank;
//  - "blocks": one placement per trainer rank 0..W-1 in order, each on a fleet rank in [0, S) (any rank: the
//    clients' spreading rule is a preference, not a requirement); the blocks inside the matrix and tiling it
//    exactly (naming the overlapping blocks or the gap); and the layout the algorithm needs — ROW_SHARDED: torch.chunk
//    shards of the tensor's dim 0 over the W trainer ranks (rows of the view), spanning all columns (a wrong count gives the seed's "rank R of W holds N
//    rows of a (d0, d1, ...) matrix, expected E"); TP_DUPLICATED / TP_DISTRIBUTED: torch.chunk shards along
//    partition_dim spanning the other dim. A trainer rank whose chunk is empty may hold any empty block.
// A plan-level error (trainer_world or fleet_world < 1) is reported for every matrix.
std::vector<absl::Status> ValidatePlan(const BatchPlan& plan);

// AUTO owner choice: matrices ordered by EstimatedCost, largest first (ties by index), each to the
// least-loaded fleet rank (ties to the lowest rank). Sets MatrixPlan::owner for every AUTO
// matrix and -1 for the others. Deterministic: a pure function of the plan.
void AssignOwners(BatchPlan& plan);
// The same with each matrix's EstimatedCost given (cost[i] for plan.matrices[i]; size equal), for
// a caller that has them already: the same owners, without estimating again.
void AssignOwners(BatchPlan& plan, absl::Span<const double> cost);

// This fleet rank's copy of one trainer rank's block of one matrix. Buffers are owned by the
// caller and must stay valid for the ExecuteBatch call; `in` and `out` must not overlap. An
// empty block may be omitted (or have null buffers).
struct LocalBlock {
  int matrix = 0;            // Index into BatchPlan::matrices.
  int trainer_rank = 0;      // Which placement of that matrix this is.
  const void* in = nullptr;  // block.numel() elements of the matrix's dtype, row-major.
  void* out = nullptr;       // block.numel() elements of the matrix's result_dtype.
  // Where `in` and `out` are: host memory, or the backend's device memory (a lone client's CUDA
  // IPC region), which only a batch that keeps its blocks in device memory takes (a collective
  // that takes device memory: NCCL, or a LocalCollective over the backend's memory).
  MemorySpace space = MemorySpace::kHost;
};

struct ExecuteOptions {
  absl::Duration collective_timeout = absl::Seconds(60);  // Per collective call.
};

// Per-matrix outcome and timing of one batch on this rank.
struct BatchResult {
  std::vector<absl::Status> matrices;  // One per plan matrix.
  absl::Duration collective_time;      // Time spent inside collective calls.
  absl::Duration compute_time;         // Time spent in the backend.
  double flops = 0;                    // NS FLOPs this rank computed.
};

// Runs the batch on this fleet rank. `local` holds the blocks whose placement's fleet_rank is
// collective.rank() (any order). Matrices whose ValidatePlan status is not OK are skipped
// identically on every rank (their outputs are not written); AUTO owners left at -1 are
// chosen here with AssignOwners. The others run with their algorithm, in this order of phases
// (within a phase, plan order):
//  - TP_BLOCKWISE: each block alone, scaled by its own shape; no collective.
//  - AUTO: every block goes to the matrix's owner (one all-to-allv for the whole batch), the
//    owner runs NS once, the result blocks come back (one all-to-allv).
//  - ROW_SHARDED: the seed's orthogonalize_exact: grouped by dtype (first appearance), ordered
//    by numel descending (ties by plan order), rounds of S matrices with fleet rank i owning
//    the i-th matrix of the round, two all-to-allv per round.
//  - GATHERED and TP_DUPLICATED: every matrix all-gathered to every fleet rank (one
//    all-gatherv per group of matrices of at most 256 MiB), NS on every rank that holds a
//    non-empty block of it, each rank keeps its blocks.
//  - TP_DISTRIBUTED: OrthogonalizeSharded over every fleet rank, each trainer block one
//    NsShard, through a reducer that keeps the ranks in step when one of them fails mid-way
//    (guarded_reducer.h).
//  - Status agreement: the per-matrix statuses are exchanged (one all-gatherv, and one more
//    for messages when something failed), so every rank reports the same status for every
//    matrix: the first failure in fleet rank order.
// Blocks travel in the matrix's dtype and results in the result dtype. Collective calls depend
// only on the plan, so they are made in the same order on every rank; fleet ranks with no
// blocks take part with empty ones. `local`'s buffers are host memory or (LocalBlock::space)
// the backend's device memory; between them and the backend the blocks are kept in the backend's
// device memory when it has one and the collective takes device memory (NCCL: each block up
// once, exchanged and assembled device to device, its result down once), in host memory
// otherwise (docs/architecture.md, "Memory spaces"); the results are the same bits either way. A
// local block whose buffers are in the batch's own memory and hold the whole matrix is computed
// where it is (no copy).
//
// Per-matrix errors (in BatchResult::matrices, identical on every rank): the ValidatePlan
// error; INVALID_ARGUMENT when a rank's local block is missing, duplicated, misplaced, has no
// buffers, or is in device memory while the batch keeps its blocks in host memory; the
// backend's error (for example INTERNAL or RESOURCE_EXHAUSTED) from the rank that computed it —
// the owner, any gathering rank, any TP participant. A failed matrix's outputs
// are unspecified. The returned status itself: INVALID_ARGUMENT when the collective's world is
// not plan.fleet_world; otherwise non-OK only when a collective call failed (UNAVAILABLE or
// DEADLINE_EXCEEDED, annotated with the phase) or this rank could not allocate a buffer of the
// batch (RESOURCE_EXHAUSTED; it aborts the collective so that its peers fail at once), after
// which the collective is broken and the outputs are unspecified. Uses the collective from one thread; the backend may be shared.
absl::StatusOr<BatchResult> ExecuteBatch(const BatchPlan& plan, absl::Span<const LocalBlock> local, Backend& backend,
                                         Collective& collective, const ExecuteOptions& options);

}  // namespace orthoserve
