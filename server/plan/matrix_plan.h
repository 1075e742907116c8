// The matrix vocabulary every layer above common/ speaks (docs/architecture.md, "Layers"): what a
// matrix of a step is (MatrixPlan), where each trainer rank's block of it lives (BlockPlacement),
// a batch of them (BatchPlan), one sender's block of one as the public ingress parsed it
// (ParsedSpec), and what computing one costs (EstimatedCost). Plain data and pure functions: no
// gRPC, no protobuf, no backend. The distributed algorithms that run a BatchPlan are
// server/distributed/batch.h; the wire forms are server/rpc/spec_codec.h (from clients) and
// server/fleet/wire/plan_codec.h (between ranks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"

namespace orthoserve {

enum class Algorithm { kAuto, kRowSharded, kGathered, kTpDuplicated, kTpDistributed, kTpBlockwise };

absl::string_view AlgorithmName(Algorithm algorithm);  // "auto", "row_sharded", ...
absl::Status ParseAlgorithm(absl::string_view text, Algorithm* algorithm);

// The modes whose partition_dim matters (TP_DUPLICATED, TP_DISTRIBUTED).
inline bool IsTpSharded(Algorithm a) { return a == Algorithm::kTpDuplicated || a == Algorithm::kTpDistributed; }

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
  // The verdict of the checks that do not depend on placements — dtypes, the view of the shape,
  // the options (ValidateNsOptions, and ValidateNsOptionsForShape of the view), the nd_layout
  // rule and partition_dim — passed. Set only where they ran: by the public ingress
  // (ParseMatrixSpec) and by ExecuteBatch for the matrices ValidatePlan passed. Never carried on
  // the wire: a plan decoded from another rank is unchecked, and ValidatePlan checks it. Whoever
  // changes one of those fields of a checked plan must clear it.
  bool checked = false;
};

struct BatchPlan {
  int trainer_world = 1;  // W.
  int fleet_world = 1;    // S.
  std::vector<MatrixPlan> matrices;
};

// The engine's batch_rows for `m` (BatchRows of its shape and layout).
inline int64_t BatchRowsOf(const MatrixPlan& m) { return BatchRows(m.shape, m.layout); }

// One sender's block of a matrix, as the public ingress validated it (ParseMatrixSpec in
// server/rpc/spec_codec.h; plan.checked is set): the matrix, the block this sender holds, and
// what computing the matrix costs (EstimatedCost, computed once there).
struct ParsedSpec {
  MatrixPlan plan;          // Without placements.
  Block block;              // The sender's block (the whole matrix for a lone client).
  int64_t block_bytes = 0;  // block.numel() · ElementSize(plan.dtype).
  double cost = 0;          // EstimatedCost(plan).
};

// Empty when `a` and `b` describe the same computation (everything but placements, owner and
// the `checked` verdict); otherwise names the first field that differs, e.g. "options.steps (5 vs 6)".
std::string FirstSpecDifference(const MatrixPlan& a, const MatrixPlan& b);

// NS FLOPs the engine spends on a rows × cols matrix with `options` (Q, K and V separately
// under split_qkv; each matrix of a batch when batch_rows > 0, see MatrixJob). Requires valid
// options for that shape (ValidateNsOptions, ValidateNsOptionsForShape).
double EngineFlops(Matrix2d shape, const NsOptions& options, int64_t batch_rows = 0);

// The estimated compute cost of `m`: NsFlops of what the engine computes (Q, K and V separately
// under split_qkv, each matrix of a batch) plus 2 per element for the normalization and scaling
// passes, so that steps = 0 matrices still count. A checked plan's verdict is used as it is; an
// unchecked one (from the wire) has its options and layout checked here first, and costs 0 when
// they would fail validation. A pure function of the plan: every rank gets the same number.
double EstimatedCost(const MatrixPlan& m);

}  // namespace orthoserve
