// A batch: the matrices of one (group, step) as the fleet executes it, and the distributed
// algorithms of docs/architecture.md that run it over a Backend and a Collective. No gRPC here.
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

namespace orthoserve {

enum class Algorithm { kAuto, kRowSharded, kGathered, kTpDuplicated, kTpDistributed, kTpBlockwise };

absl::string_view AlgorithmName(Algorithm algorithm);  // "auto", "row_sharded", ...
absl::Status ParseAlgorithm(absl::string_view text, Algorithm* algorithm);

// Where one trainer rank's block of a matrix lives.
struct BlockPlacement {
  int trainer_rank = 0;
  int fleet_rank = 0;  // The collective rank holding the block: any rank (clients prefer FleetRankOfTrainer).
  Block block;         // In the matrix's 2-D view; may be empty.
};

struct MatrixPlan {
  std::string name;
  std::vector<int64_t> shape;  // Global shape as sent (N-d allowed).
  NdLayout layout = NdLayout::kFlatten;  // How `shape` is read as matrices.
  Matrix2d view;               // ViewAs2d(shape, layout).
  DType dtype = DType::kF32;   // Dtype of the blocks' bytes.
  DType result_dtype = DType::kF32;
  NsOptions options;
  Algorithm algorithm = Algorithm::kAuto;
  int partition_dim = 0;               // TP modes only: 0 or 1.
  std::vector<BlockPlacement> blocks;  // One per trainer rank, ordered by trainer rank.
  int owner = -1;                      // AUTO: the fleet rank that assembles it (AssignOwners).
};

struct BatchPlan {
  int trainer_world = 1;  // W.
  int fleet_world = 1;    // S.
  std::vector<MatrixPlan> matrices;
};

// Per-matrix validation of a plan, identical on every rank. Returns one status per matrix, OK or
// INVALID_ARGUMENT with a message that starts with `matrix "name"` and names the field:
//  - "algorithm", "dtype", "result_dtype": known enum values;
//  - "shape" (ViewAs2d) and "view" (must equal ViewAs2d(shape, layout));
//  - "nd_layout": a batch of several matrices (BatchRows > 0) takes neither split_qkv nor
//    TP_DISTRIBUTED or TP_BLOCKWISE (whose blocks are orthogonalized without the whole matrix);
//  - "options": ValidateNsOptions and ValidateNsOptionsForShape (split_qkv divisibility of the
//    whole matrix, and of every non-empty block for TP_BLOCKWISE and for TP_DISTRIBUTED with
//    partition_dim 0, whose blocks are split locally);
//  - "partition_dim": 0 or 1 for TP_DUPLICATED and TP_DISTRIBUTED (ignored otherwise);
//  - "owner": AUTO only, -1 (not assigned yet) or a fleet rank;
//  - "blocks": one placement per trainer rank 0..W-1 in order, each on a fleet rank in [0, S) (any rank: the
//    clients' spreading rule is a preference, not a requirement); the blocks inside the matrix and tiling it
//    exactly (naming the overlapping blocks or the gap); and the layout the algorithm needs — ROW_SHARDED: torch.chunk
//    shards of the tensor's dim 0 over the W trainer ranks (rows of the view), spanning all columns (a wrong count gives the seed's "rank R of W holds N
//    rows of a (d0, d1, ...) matrix, expected E"); TP_DUPLICATED / TP_DISTRIBUTED: torch.chunk shards along
//    partition_dim spanning the other dim. A trainer rank whose chunk is empty may hold any empty block.
// A plan-level error (trainer_world or fleet_world < 1) is reported for every matrix.
std::vector<absl::Status> ValidatePlan(const BatchPlan& plan);

// The "nd_layout" check of ValidatePlan on its own, for ingress: `what` starts the message.
absl::Status ValidateNdLayout(const MatrixPlan& m, const std::string& what);

// The engine's batch_rows for `m` (BatchRows of its shape and layout).
inline int64_t BatchRowsOf(const MatrixPlan& m) { return BatchRows(m.shape, m.layout); }

// One sender's block of a matrix, as validated at ingress (server/fleet/spec_codec.h parses it
// from the wire): the matrix and the block this sender holds.
struct ParsedSpec {
  MatrixPlan plan;          // Without placements.
  Block block;              // The sender's block (the whole matrix for a lone client).
  int64_t block_bytes = 0;  // block.numel() · ElementSize(plan.dtype).
};

// Empty when `a` and `b` describe the same computation (everything but placements and owner);
// otherwise names the first field that differs, e.g. "options.steps (5 vs 6)".
std::string FirstSpecDifference(const MatrixPlan& a, const MatrixPlan& b);

// The estimated compute cost of `m`: NsFlops of what the engine computes (Q, K and V separately
// under split_qkv, each matrix of a batch) plus 2 per element for the normalization and scaling
// passes, so that steps = 0 matrices still count; 0 for a matrix that will fail validation.
double EstimatedCost(const MatrixPlan& m);

// AUTO owner choice: matrices ordered by EstimatedCost, largest first (ties by index), each to the
// least-loaded fleet rank (ties to the lowest rank). Sets MatrixPlan::owner for every AUTO
// matrix and -1 for the others. Deterministic: a pure function of the plan.
void AssignOwners(BatchPlan& plan);

// This fleet rank's copy of one trainer rank's block of one matrix. Buffers are owned by the
// caller and must stay valid for the ExecuteBatch call; `in` and `out` must not overlap. An
// empty block may be omitted (or have null buffers).
struct LocalBlock {
  int matrix = 0;            // Index into BatchPlan::matrices.
  int trainer_rank = 0;      // Which placement of that matrix this is.
  const void* in = nullptr;  // block.numel() elements of the matrix's dtype, row-major.
  void* out = nullptr;       // block.numel() elements of the matrix's result_dtype.
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
// blocks take part with empty ones. `local`'s buffers are host memory; between them and the
// backend the blocks are kept in the backend's device memory when it has one and the collective
// takes device memory (NCCL: each block up once, exchanged and assembled device to device, its
// result down once), in host memory otherwise (docs/architecture.md, "Memory spaces"); the
// results are the same bits either way.
//
// Per-matrix errors (in BatchResult::matrices, identical on every rank): the ValidatePlan
// error; INVALID_ARGUMENT when a rank's local block is missing, duplicated, misplaced or has no
// buffers; the backend's error (for example INTERNAL or RESOURCE_EXHAUSTED) from the rank that
// computed it — the owner, any gathering rank, any TP participant. A failed matrix's outputs
// are unspecified. The returned status itself: INVALID_ARGUMENT when the collective's world is
// not plan.fleet_world; otherwise non-OK only when a collective call failed (UNAVAILABLE or
// DEADLINE_EXCEEDED, annotated with the phase) or this rank could not allocate a buffer of the
// batch (RESOURCE_EXHAUSTED; it aborts the collective so that its peers fail at once), after
// which the collective is broken and the outputs are unspecified. Uses the collective from one thread; the backend may be shared.
absl::StatusOr<BatchResult> ExecuteBatch(const BatchPlan& plan, absl::Span<const LocalBlock> local, Backend& backend,
                                         Collective& collective, const ExecuteOptions& options);

}  // namespace orthoserve
