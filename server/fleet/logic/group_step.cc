// TakeRegionInputs of server/fleet/logic/group_step.h: what a trainer step read from its
// shared-memory regions becomes its own before the step is kept for replays.
#include <vector>

#include "common/block_digest.h"
#include "server/fleet/logic/group_step.h"

namespace orthoserve {

bool TakeRegionInputs(TrainerStep& step) {
  bool from_region = false;
  for (size_t i = 0; i < step.input_at.size() && i < step.sent.size(); ++i) {
    if (step.input_at[i] == nullptr) continue;
    const absl::string_view in = step.input(i);
    step.inputs[i].assign(in.begin(), in.end());
    from_region = true;
  }
  step.input_at.clear();
  step.output_at.clear();
  step.regions.reset();
  // Only bytes copied out of a region can differ from what arrived: a step whose inputs all came
  // as bytes is not digested again.
  if (!from_region) return true;
  std::vector<DigestedBlock> digested;
  digested.reserve(step.sent.size());
  for (size_t i = 0; i < step.sent.size(); ++i) {
    StreamDigest bytes;
    bytes.Update(absl::string_view(step.inputs[i].data(), step.inputs[i].size()));
    digested.push_back(DigestedBlock{step.sent.blocks[i], step.sent.spec(i).dtype, bytes.Value()});
  }
  return StepDigest(digested) == step.digest;
}

}  // namespace orthoserve
