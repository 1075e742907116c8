// Implementation of batch_harness.h.
#include "tests/unit/distributed/batch_harness.h"

#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/util/rank_threads.h"

namespace orthoserve::testing {
namespace {

Block ChunkBlock(Matrix2d view, int world, int r, bool by_rows) {
  const std::vector<int64_t> sizes = ChunkSizes(by_rows ? view.rows : view.cols, world);
  const std::vector<int64_t> offsets = ChunkOffsets(by_rows ? view.rows : view.cols, world);
  return by_rows ? Block{offsets[r], 0, sizes[r], view.cols} : Block{0, offsets[r], view.rows, sizes[r]};
}

}  // namespace

std::vector<Block> MakeBlocks(Matrix2d view, int world, Layout layout) {
  std::vector<Block> blocks(world);
  switch (layout) {
    case Layout::kRows:
    case Layout::kCols:
      for (int r = 0; r < world; ++r) blocks[r] = ChunkBlock(view, world, r, layout == Layout::kRows);
      break;
    case Layout::kReversedRows:
      for (int r = 0; r < world; ++r) blocks[r] = ChunkBlock(view, world, world - 1 - r, true);
      break;
    case Layout::kWholeOnLast:
      for (int r = 0; r < world; ++r) blocks[r] = Block{0, 0, 0, 0};
      blocks[world - 1] = WholeBlock(view);
      break;
    case Layout::kGrid: {
      int gr = 1;
      for (int d = 1; d * d <= world; ++d) {
        if (world % d == 0) gr = d;
      }
      const int gc = world / gr;
      const std::vector<int64_t> rs = ChunkSizes(view.rows, gr), ro = ChunkOffsets(view.rows, gr);
      const std::vector<int64_t> cs = ChunkSizes(view.cols, gc), co = ChunkOffsets(view.cols, gc);
      for (int r = 0; r < world; ++r) blocks[r] = Block{ro[r / gc], co[r % gc], rs[r / gc], cs[r % gc]};
      break;
    }
  }
  return blocks;
}

MatrixPlan MakeMatrixPlan(const MatrixSpec& spec, int trainer_world, int fleet_world) {
  MatrixPlan m;
  m.name = spec.name;
  m.shape = spec.shape;
  m.layout = spec.nd;
  absl::StatusOr<Matrix2d> view = ViewAs2d(spec.shape, spec.name, spec.nd);
  m.view = view.ok() ? *view : Matrix2d{0, 0};
  m.dtype = spec.dtype;
  m.result_dtype = spec.result_dtype;
  m.options = spec.options;
  m.algorithm = spec.algorithm;
  m.partition_dim = spec.partition_dim;
  const std::vector<Block> blocks = MakeBlocks(m.view, trainer_world, spec.layout);
  for (int r = 0; r < trainer_world; ++r) {
    m.blocks.push_back(BlockPlacement{r, FleetRankOfTrainer(r, trainer_world, fleet_world), blocks[r]});
  }
  return m;
}

BatchPlan MakePlan(int trainer_world, int fleet_world, const std::vector<MatrixSpec>& specs) {
  BatchPlan plan;
  plan.trainer_world = trainer_world;
  plan.fleet_world = fleet_world;
  for (const MatrixSpec& spec : specs) plan.matrices.push_back(MakeMatrixPlan(spec, trainer_world, fleet_world));
  AssignOwners(plan);
  return plan;
}

std::vector<char> RandomMatrix(Matrix2d view, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(view.numel()));
  for (float& v : values) v = dist(gen);
  std::vector<char> bytes(values.size() * ElementSize(dtype));
  ConvertFromF32(dtype, values.data(), values.size(), bytes.data());
  return bytes;
}

BatchData MakeData(const BatchPlan& plan, const std::vector<MatrixSpec>& specs) {
  BatchData data;
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    const MatrixPlan& m = plan.matrices[i];
    data.whole.push_back(RandomMatrix(m.view, m.dtype, specs[i].seed));
    data.in.emplace_back();
    data.out.emplace_back();
    for (const BlockPlacement& p : m.blocks) {
      std::vector<char> in(static_cast<size_t>(p.block.numel()) * ElementSize(m.dtype));
      if (!p.block.empty()) {
        CopyBlockOut(data.whole.back().data(), m.view.cols, p.block, ElementSize(m.dtype), in.data());
      }
      data.in.back().push_back(std::move(in));
      data.out.back().emplace_back(static_cast<size_t>(p.block.numel()) * ElementSize(m.result_dtype), '\xff');
    }
  }
  return data;
}

std::vector<LocalBlock> LocalBlocksOf(const BatchPlan& plan, BatchData& data, int fleet_rank) {
  std::vector<LocalBlock> local;
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    for (const BlockPlacement& p : plan.matrices[i].blocks) {
      if (p.fleet_rank != fleet_rank) continue;
      local.push_back(LocalBlock{static_cast<int>(i), p.trainer_rank, data.in[i][p.trainer_rank].data(),
                                 data.out[i][p.trainer_rank].data()});
    }
  }
  return local;
}

std::vector<absl::StatusOr<BatchResult>> RunFleet(const BatchPlan& plan, BatchData& data,
                                                  const std::vector<Backend*>& backends,
                                                  const ExecuteOptions& options) {
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(plan.fleet_world);
  EXPECT_TRUE(group.ok()) << group.status();
  if (!group.ok()) return {};
  std::vector<absl::StatusOr<BatchResult>> results(plan.fleet_world, absl::UnknownError("not run"));
  RunRanks(plan.fleet_world, [&](int rank) {
    std::vector<LocalBlock> local = LocalBlocksOf(plan, data, rank);
    results[rank] = ExecuteBatch(plan, local, *backends[rank % backends.size()], *(*group)[rank], options);
  });
  return results;
}

std::vector<char> AssembleResult(const BatchPlan& plan, const BatchData& data, int m) {
  const MatrixPlan& mp = plan.matrices[m];
  std::vector<char> whole(static_cast<size_t>(mp.view.numel()) * ElementSize(mp.result_dtype), '\xff');
  for (const BlockPlacement& p : mp.blocks) {
    if (p.block.empty()) continue;
    CopyBlockIn(data.out[m][p.trainer_rank].data(), p.block, ElementSize(mp.result_dtype), whole.data(), mp.view.cols);
  }
  return whole;
}

std::vector<char> WholeReference(Backend& backend, const MatrixPlan& m, const std::vector<char>& whole) {
  std::vector<char> out(static_cast<size_t>(m.view.numel()) * ElementSize(m.result_dtype));
  // A batch's reference is each of its matrices run alone.
  const int64_t rows = BatchRowsOf(m) > 0 ? BatchRowsOf(m) : m.view.rows;
  const size_t in_bytes = static_cast<size_t>(rows * m.view.cols) * ElementSize(m.dtype);
  const size_t out_bytes = static_cast<size_t>(rows * m.view.cols) * ElementSize(m.result_dtype);
  for (int64_t b = 0; b < m.view.rows / rows; ++b) {
    MatrixJob job{m.name, {rows, m.view.cols}, {rows, m.view.cols}, m.dtype, whole.data() + b * in_bytes,
                  m.result_dtype, out.data() + b * out_bytes, &m.options};
    absl::Status status = OrthogonalizeOne(backend, job);
    EXPECT_TRUE(status.ok()) << status;
  }
  return out;
}

std::vector<char> BlockwiseReference(Backend& backend, const MatrixPlan& m, const std::vector<char>& whole) {
  std::vector<char> out(static_cast<size_t>(m.view.numel()) * ElementSize(m.result_dtype), '\xff');
  for (const BlockPlacement& p : m.blocks) {
    if (p.block.empty()) continue;
    const Matrix2d shape{p.block.rows, p.block.cols};
    std::vector<char> in(static_cast<size_t>(p.block.numel()) * ElementSize(m.dtype));
    std::vector<char> res(static_cast<size_t>(p.block.numel()) * ElementSize(m.result_dtype));
    CopyBlockOut(whole.data(), m.view.cols, p.block, ElementSize(m.dtype), in.data());
    MatrixJob job{m.name, shape, shape, m.dtype, in.data(), m.result_dtype, res.data(), &m.options};
    absl::Status status = OrthogonalizeOne(backend, job);
    EXPECT_TRUE(status.ok()) << status;
    CopyBlockIn(res.data(), p.block, ElementSize(m.result_dtype), out.data(), m.view.cols);
  }
  return out;
}

std::vector<float> ToF32(DType dtype, const std::vector<char>& bytes) {
  std::vector<float> values(bytes.size() / ElementSize(dtype));
  ConvertToF32(dtype, bytes.data(), values.size(), values.data());
  return values;
}

double RelativeFrobenius(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(diff) / std::sqrt(norm);
}

Backend& SharedCpuBackend() {
  static Backend* backend = [] {
    absl::StatusOr<std::unique_ptr<CpuBackend>> made = CpuBackend::Create(CpuBackend::Options{1});
    if (!made.ok()) std::abort();
    return made->release();
  }();
  return *backend;
}

}  // namespace orthoserve::testing
