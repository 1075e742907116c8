// A batch: the matrices of one (group, step) as the fleet executes it, and the distributed
// algorithms of DESIGN §3 that run it over a Backend and a Collective. No gRPC here.
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
  int fleet_rank = 0;  // FleetRankOfTrainer(trainer_rank, trainer_world, fleet_world).
  Block block;         // In the matrix's 2-D view; may be empty.
};

struct MatrixPlan {
  std::string name;
  std::vector<int64_t> shape;  // Global shape as sent (N-d allowed).
  Matrix2d view;               // ViewAs2d(shape).
  DType dtype = DType::kF32;   // Dtype of the blocks' bytes.
  DType result_dtype = DType::kF32;
  NsOptions options;
  Algorithm algorithm = Algorithm::kAuto;
  int partition_dim = 0;                // TP modes only: 0 or 1.
  std::vector<BlockPlacement> blocks;   // One per trainer rank, ordered by trainer rank.
  int owner = -1;                       // AUTO: the fleet rank that assembles it (AssignOwners).
};

struct BatchPlan {
  int trainer_world = 1;  // W.
  int fleet_world = 1;    // S.
  std::vector<MatrixPlan> matrices;
};

// Per-matrix validation of a plan, identical on every rank: blocks inside the matrix and tiling
// it exactly (INVALID_ARGUMENT naming the matrix and the overlap or gap), the layout an
// algorithm needs (ROW_SHARDED: torch.chunk row shards over the W trainer ranks — the message
// names rank, world, shape and the expected row count; TP_DUPLICATED/TP_DISTRIBUTED:
// torch.chunk shards along partition_dim spanning the other dim; partition_dim 0 or 1), option
// validity, split_qkv divisibility. Returns one status per matrix.
std::vector<absl::Status> ValidatePlan(const BatchPlan& plan);

// AUTO owner choice: matrices ordered by estimated cost (NsFlops, ties by index), largest first,
// each to the least-loaded fleet rank (ties to the lowest rank). Sets MatrixPlan::owner for
// AUTO matrices; leaves the others at -1. Deterministic.
void AssignOwners(BatchPlan& plan);

// This fleet rank's copy of one trainer rank's block of one matrix.
struct LocalBlock {
  int matrix = 0;        // Index into BatchPlan::matrices.
  int trainer_rank = 0;  // Which placement of that matrix this is.
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

// Runs the batch on this fleet rank. `local` holds exactly the blocks whose placement's
// fleet_rank is collective.rank() (any order). Matrices whose ValidatePlan status is not OK are
// skipped identically on every rank; the others run with their algorithm:
//  - AUTO: every block goes to the matrix's owner (one all-to-allv for the whole batch), the
//    owner runs NS once, the result blocks come back (one all-to-allv).
//  - ROW_SHARDED: the seed's orthogonalize_exact: grouped by dtype, ordered by numel
//    descending, rounds of S matrices with fleet rank i owning the i-th matrix of the round,
//    two all-to-allv per round.
//  - GATHERED and TP_DUPLICATED: every matrix all-gathered to every fleet rank, NS everywhere,
//    each rank keeps its blocks.
//  - TP_DISTRIBUTED: OrthogonalizeSharded with a SumReducer over the collective.
//  - TP_BLOCKWISE: each block alone, scaled by its own shape; no collective.
// Collective calls are made in the same order on every rank. Returns the per-matrix statuses;
// a failing collective fails the whole batch (the returned status: UNAVAILABLE or
// DEADLINE_EXCEEDED), after which the collective is broken.
absl::StatusOr<BatchResult> ExecuteBatch(const BatchPlan& plan, absl::Span<const LocalBlock> local, Backend& backend,
                                         Collective& collective, const ExecuteOptions& options);

}  // namespace orthoserve
