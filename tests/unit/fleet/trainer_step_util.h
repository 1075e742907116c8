// Trainer steps for the fleet's unit tests: one trainer rank's torch.chunk row block of an fp32
// matrix, as the RPC layer would hand it to the executor.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/block_digest.h"
#include "server/fleet/logic/group_step.h"

namespace orthoserve::testing {

// Sets step.digest as the RPC layer computes it from the blocks it received (FleetStep).
inline void SetDigest(TrainerStep& step) {
  std::vector<DigestedBlock> blocks;
  for (size_t i = 0; i < step.sent.size(); ++i) {
    StreamDigest bytes;
    bytes.Update(absl::string_view(step.inputs[i].data(), step.inputs[i].size()));
    blocks.push_back(DigestedBlock{step.sent.blocks[i], step.sent.spec(i).dtype, bytes.Value()});
  }
  step.digest = StepDigest(blocks);
}

// Trainer rank `r` of `world`'s row block (rows / world rows) of the rows x cols row-major
// `full`, as a one-matrix step named "w" with `options` and `algorithm`.
inline std::shared_ptr<TrainerStep> RowBlockStep(const GroupKey& key, int r, int world, int64_t rows, int64_t cols,
                                                 const std::vector<float>& full, const NsOptions& options,
                                                 Algorithm algorithm = Algorithm::kAuto, int attempt = 0) {
  auto step = std::make_shared<TrainerStep>();
  step->key = key;
  step->trainer_rank = r;
  step->trainer_world = world;
  step->attempt = attempt;
  step->submitted = absl::Now();
  const int64_t block_rows = rows / world;
  MatrixPlan m;
  m.name = "w";
  m.shape = {rows, cols};
  m.view = Matrix2d{rows, cols};
  m.options = options;
  m.algorithm = algorithm;
  step->sent = SenderBlocks(SpecList{m}, {Block{r * block_rows, 0, block_rows, cols}});
  const char* begin = reinterpret_cast<const char*>(full.data() + r * block_rows * cols);
  step->inputs = {std::vector<char>(begin, begin + block_rows * cols * sizeof(float))};
  SetDigest(*step);
  return step;
}

}  // namespace orthoserve::testing
