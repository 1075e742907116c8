// ValidatePlan (batch.h): per-matrix checks of a batch plan, a pure function of the plan so that
// every fleet rank reaches the same verdicts. The checks that do not depend on placements are
// CheckMatrix (server/plan/matrix_checks.h), skipped for a plan that passed them already.
#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/message_text.h"
#include "common/status.h"
#include "server/distributed/batch.h"
#include "server/plan/matrix_checks.h"

namespace orthoserve {
namespace {

// "(6, 4, 3)": the shape as Python prints a tuple, as in the seed's row-count message.
std::string ShapeTuple(const std::vector<int64_t>& shape) { return absl::StrCat("(", ListText(shape), ")"); }

// Whether the blocks lie inside `m` and tile it exactly — CheckTiling's verdict when that is OK —
// in O(n log n) for n blocks, O(n) for bands already in order (the torch.chunk shards of FSDP,
// ROW_SHARDED and the TP modes), where CheckTiling compares every pair: with n = W blocks per
// matrix, a 560-matrix step over W = 1024 trainer ranks spent 0.45 s in it on every fleet rank
// before each batch. False when they do not tile `m`: the caller asks CheckTiling for the message
// (the first overlapping pair, a gap or a block outside), so verdicts and messages are CheckTiling's.
bool TilesExactly(Matrix2d m, absl::Span<const Block> blocks) {
  std::vector<const Block*> live;
  live.reserve(blocks.size());
  int64_t area = 0;
  bool row_bands = true;  // Every non-empty block spans all columns.
  bool col_bands = true;  // Every non-empty block spans all rows.
  for (const Block& b : blocks) {
    // CheckBlockInside's condition.
    if (b.row_offset < 0 || b.col_offset < 0 || b.rows < 0 || b.cols < 0 || b.row_offset > m.rows - b.rows ||
        b.col_offset > m.cols - b.cols) {
      return false;
    }
    if (b.empty()) continue;
    area += b.numel();
    live.push_back(&b);
    row_bands = row_bands && b.col_offset == 0 && b.cols == m.cols;
    col_bands = col_bands && b.row_offset == 0 && b.rows == m.rows;
  }
  // Inside, and covering as many cells as the matrix has: they tile it iff no two overlap.
  if (area != m.numel()) return false;
  if (row_bands || col_bands) {
    // Bands: disjoint iff, in order of their start, each starts at or after the previous one's end.
    auto start = [&](const Block* b) { return row_bands ? b->row_offset : b->col_offset; };
    auto end = [&](const Block* b) { return row_bands ? b->row_offset + b->rows : b->col_offset + b->cols; };
    auto before = [&](const Block* a, const Block* b) { return start(a) < start(b); };
    if (!std::is_sorted(live.begin(), live.end(), before)) std::sort(live.begin(), live.end(), before);
    for (size_t i = 1; i < live.size(); ++i) {
      if (start(live[i]) < end(live[i - 1])) return false;
    }
    return true;
  }
  // A sweep down the rows: a block enters at its first row and leaves after its last (leaving
  // first at a row where one leaves and another enters). The blocks spanning the current row are
  // disjoint in columns; kept by first column, a block that enters can only overlap one of its two
  // neighbours there, and any two blocks whose rows overlap both span the row where the later enters.
  struct Event {
    int64_t row;
    bool enters;
    const Block* block;
  };
  std::vector<Event> events;
  events.reserve(2 * live.size());
  for (const Block* b : live) {
    events.push_back(Event{b->row_offset, true, b});
    events.push_back(Event{b->row_offset + b->rows, false, b});
  }
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.row < b.row || (a.row == b.row && !a.enters && b.enters); });
  std::map<int64_t, int64_t> spanning;  // First column -> end column.
  for (const Event& e : events) {
    const int64_t c0 = e.block->col_offset;
    if (!e.enters) {
      spanning.erase(c0);
      continue;
    }
    const int64_t c1 = c0 + e.block->cols;
    auto next = spanning.lower_bound(c0);
    if (next != spanning.end() && next->first < c1) return false;
    if (next != spanning.begin() && std::prev(next)->second > c0) return false;
    spanning.emplace(c0, c1);
  }
  return true;
}

// ROW_SHARDED: trainer rank r holds torch.chunk row shard r of W, spanning every column.
absl::Status CheckRowShardedLayout(const MatrixPlan& m, int world, const std::string& what) {
  // torch.chunk splits the tensor's dim 0; each of its entries is `unit` rows of the view (1 when
  // flattened, prod(shape[1:-1]) for a batch).
  const int64_t unit = m.view.rows / m.shape[0];
  std::vector<int64_t> sizes = ChunkSizes(m.shape[0], world);
  std::vector<int64_t> offsets = ChunkOffsets(m.shape[0], world);
  for (int64_t& n : sizes) n *= unit;
  for (int64_t& n : offsets) n *= unit;
  for (int r = 0; r < world; ++r) {
    const Block& b = m.blocks[r].block;
    if (sizes[r] == 0 && b.empty()) continue;
    if (b.rows != sizes[r]) {
      return absl::InvalidArgumentError(absl::StrCat(what, " row_sharded blocks: rank ", r, " of ", world, " holds ",
                                                     b.rows, " rows of a ", ShapeTuple(m.shape), " matrix, expected ",
                                                     sizes[r]));
    }
    if (b.row_offset != offsets[r] || b.col_offset != 0 || b.cols != m.view.cols) {
      return absl::InvalidArgumentError(absl::StrCat(what, " row_sharded blocks: rank ", r, " of ", world, " holds ",
                                                     BlockString(b), " of a ", ShapeTuple(m.shape),
                                                     " matrix, expected its torch.chunk row shard ",
                                                     BlockString(Block{offsets[r], 0, sizes[r], m.view.cols})));
    }
  }
  return absl::OkStatus();
}

// TP_DUPLICATED / TP_DISTRIBUTED: trainer rank r holds torch.chunk shard r of W along
// partition_dim, spanning the other dim.
absl::Status CheckTpLayout(const MatrixPlan& m, int world, const std::string& what) {
  const bool by_rows = m.partition_dim == 0;
  const int64_t extent = by_rows ? m.view.rows : m.view.cols;
  const std::vector<int64_t> sizes = ChunkSizes(extent, world);
  const std::vector<int64_t> offsets = ChunkOffsets(extent, world);
  for (int r = 0; r < world; ++r) {
    const Block& b = m.blocks[r].block;
    if (sizes[r] == 0 && b.empty()) continue;
    const Block expected =
        by_rows ? Block{offsets[r], 0, sizes[r], m.view.cols} : Block{0, offsets[r], m.view.rows, sizes[r]};
    if (!(b == expected)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", AlgorithmName(m.algorithm), " blocks (partition_dim ", m.partition_dim,
                       "): trainer rank ", r, " of ", world, " holds ", BlockString(b), " of the ", m.view.rows, "x",
                       m.view.cols, " matrix, expected its torch.chunk shard ", BlockString(expected)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::Status ValidateMatrix(const BatchPlan& plan, const MatrixPlan& m) {
  const std::string what = absl::StrCat("matrix \"", BoundedText(m.name), "\"");
  const int world = plan.trainer_world;
  // What does not depend on placements was checked once, where the plan entered this process
  // (the public ingress), or is checked here (a plan from the wire).
  if (!m.checked) RETURN_IF_ERROR(CheckMatrix(m, what));
  if (m.algorithm == Algorithm::kAuto && (m.owner < -1 || m.owner >= plan.fleet_world)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " owner: ", m.owner, " is not a fleet rank of a ", plan.fleet_world, "-rank fleet"));
  }

  if (m.blocks.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " blocks: ", m.blocks.size(),
                                                   " placements for a trainer group of ", world,
                                                   " ranks; every trainer rank needs exactly one"));
  }
  std::vector<Block> blocks;
  blocks.reserve(world);
  for (int r = 0; r < world; ++r) {
    const BlockPlacement& p = m.blocks[r];
    if (p.trainer_rank != r) {
      return absl::InvalidArgumentError(absl::StrCat(what, " blocks: placement ", r, " is for trainer rank ",
                                                     p.trainer_rank, "; placements must be ordered by trainer rank 0..",
                                                     world - 1, " with one per rank"));
    }
    if (p.fleet_rank < 0 || p.fleet_rank >= plan.fleet_world) {
      return absl::InvalidArgumentError(absl::StrCat(what, " blocks: trainer rank ", r, " of ", world,
                                                     " is placed on fleet rank ", p.fleet_rank, ", outside the ",
                                                     plan.fleet_world, "-rank fleet"));
    }
    // Any trainer rank may stream to any fleet rank (clients spread a group evenly by
    // preference, and a retry after a fleet change goes wherever a member is ready).
    blocks.push_back(p.block);
  }
  if (!TilesExactly(m.view, blocks)) RETURN_IF_ERROR(CheckTiling(m.view, blocks, absl::StrCat(what, " blocks")));

  switch (m.algorithm) {
    case Algorithm::kRowSharded:
      RETURN_IF_ERROR(CheckRowShardedLayout(m, world, what));
      break;
    case Algorithm::kTpDuplicated:
    case Algorithm::kTpDistributed:
      RETURN_IF_ERROR(CheckTpLayout(m, world, what));
      break;
    default:
      break;
  }

  // Blocks orthogonalized as matrices of their own (TP_BLOCKWISE) or split locally
  // (TP_DISTRIBUTED along rows) need split_qkv to divide each block's rows.
  const bool per_block_qkv =
      m.algorithm == Algorithm::kTpBlockwise || (m.algorithm == Algorithm::kTpDistributed && m.partition_dim == 0);
  if (per_block_qkv && !m.options.split_qkv.empty()) {
    for (int r = 0; r < world; ++r) {
      const Block& b = m.blocks[r].block;
      if (b.empty()) continue;
      RETURN_IF_ERROR(ValidateNsOptionsForShape(m.options, Matrix2d{b.rows, b.cols},
                                                absl::StrCat(what, " options (block of trainer rank ", r, ")")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<absl::Status> ValidatePlan(const BatchPlan& plan) {
  absl::Status group = absl::OkStatus();
  if (plan.trainer_world < 1) {
    group = absl::InvalidArgumentError(absl::StrCat("trainer_world: ", plan.trainer_world, " must be at least 1"));
  } else if (plan.fleet_world < 1) {
    group = absl::InvalidArgumentError(absl::StrCat("fleet_world: ", plan.fleet_world, " must be at least 1"));
  }
  std::vector<absl::Status> statuses;
  statuses.reserve(plan.matrices.size());
  for (const MatrixPlan& m : plan.matrices) {
    statuses.push_back(group.ok() ? ValidateMatrix(plan, m)
                                  : Annotate(group, absl::StrCat("matrix \"", BoundedText(m.name), "\"")));
  }
  return statuses;
}

}  // namespace orthoserve
