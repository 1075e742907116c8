// Test harness for server/distributed: plans built from compact specs and block layouts,
// deterministic inputs, a fleet of S ranks run as threads over GlooCollectives on loopback, and
// the references (engine NS of the whole matrix, or of each block) the results are held to.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "common/shape.h"
#include "server/distributed/batch.h"
#include "server/engine/backend.h"

namespace orthoserve::testing {

// How the W trainer ranks split a matrix's 2-D view.
enum class Layout {
  kRows,          // torch.chunk row shards, rank r holds chunk r.
  kCols,          // torch.chunk column shards.
  kGrid,          // A gr × gc grid of torch.chunk tiles (gr·gc = W, gr the largest divisor <= √W).
  kReversedRows,  // Row chunks in reverse: rank r holds chunk W-1-r.
  kWholeOnLast,   // Rank W-1 holds the whole matrix; the others hold empty blocks.
};

std::vector<Block> MakeBlocks(Matrix2d view, int trainer_world, Layout layout);

struct MatrixSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  DType result_dtype = DType::kF32;
  NsOptions options;
  Algorithm algorithm = Algorithm::kAuto;
  int partition_dim = 0;
  Layout layout = Layout::kRows;
  NdLayout nd = NdLayout::kFlatten;  // How `shape` is read as matrices.
  uint32_t seed = 1;  // Seeds the matrix's data: equal seeds and shapes give equal inputs.
};

// The plan of one matrix (blocks from its layout, placements by FleetRankOfTrainer).
MatrixPlan MakeMatrixPlan(const MatrixSpec& spec, int trainer_world, int fleet_world);
// The plan of a batch, with AssignOwners applied.
BatchPlan MakePlan(int trainer_world, int fleet_world, const std::vector<MatrixSpec>& specs);

// Uniform values in [-1, 1) from `seed`, narrowed to `dtype`, row-major.
std::vector<char> RandomMatrix(Matrix2d view, DType dtype, uint32_t seed);

// What the trainers hold: each matrix's whole input, and per trainer rank its input block and
// an output block filled with a NaN sentinel (so a result never written shows).
struct BatchData {
  std::vector<std::vector<char>> whole;                 // [matrix]
  std::vector<std::vector<std::vector<char>>> in, out;  // [matrix][trainer rank]
};
BatchData MakeData(const BatchPlan& plan, const std::vector<MatrixSpec>& specs);

// The LocalBlocks of fleet rank `fleet_rank` (every placement on it, empty ones included).
std::vector<LocalBlock> LocalBlocksOf(const BatchPlan& plan, BatchData& data, int fleet_rank);

// Runs ExecuteBatch on every fleet rank of a fresh Gloo group (threads), rank r on
// *backends[r % backends.size()]. Fails the test (and returns an empty vector) if the group
// cannot form.
std::vector<absl::StatusOr<BatchResult>> RunFleet(const BatchPlan& plan, BatchData& data,
                                                  const std::vector<Backend*>& backends,
                                                  const ExecuteOptions& options = ExecuteOptions());

// Matrix `m`'s result as the trainers received it, put back together (result dtype bytes).
std::vector<char> AssembleResult(const BatchPlan& plan, const BatchData& data, int m);

// Engine NS of the whole matrix: the reference for AUTO, ROW_SHARDED, GATHERED, TP_DUPLICATED.
std::vector<char> WholeReference(Backend& backend, const MatrixPlan& m, const std::vector<char>& whole);

// Engine NS of each block on its own, scaled by its own shape, put together: TP_BLOCKWISE.
std::vector<char> BlockwiseReference(Backend& backend, const MatrixPlan& m, const std::vector<char>& whole);

std::vector<float> ToF32(DType dtype, const std::vector<char>& bytes);
// ‖a − b‖_F / ‖b‖_F.
double RelativeFrobenius(const std::vector<float>& a, const std::vector<float>& b);

// The CPU backend every test shares (one thread per product).
Backend& SharedCpuBackend();

}  // namespace orthoserve::testing
