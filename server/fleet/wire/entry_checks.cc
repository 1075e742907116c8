// Implementation of server/fleet/wire/entry_checks.h.
#include "server/fleet/wire/entry_checks.h"

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "server/fleet/wire/fleet_codec.h"

namespace orthoserve {

absl::Status CheckBatchShape(const LogEntry& entry) {
  if (entry.membership() || !entry.status.ok()) return absl::OkStatus();
  const BatchPlan& plan = entry.plan;
  const int world = plan.trainer_world;
  if (world < 1 || world > kMaxFleetTrainerWorld) {
    return absl::InvalidArgumentError(absl::StrCat("trainer world ", world, " is not 1 to ", kMaxFleetTrainerWorld));
  }
  if (plan.fleet_world < 1) return absl::InvalidArgumentError(absl::StrCat("fleet world ", plan.fleet_world));
  const size_t w = static_cast<size_t>(world);
  if (entry.submissions.size() != w) {
    return absl::InvalidArgumentError(
        absl::StrCat(entry.submissions.size(), " submissions for ", world, " trainer ranks"));
  }
  if (!entry.digests.empty() && entry.digests.size() != w) {
    return absl::InvalidArgumentError(absl::StrCat(entry.digests.size(), " digests for ", world, " trainer ranks"));
  }
  if (!entry.cached.empty() && entry.cached.size() != w) {
    return absl::InvalidArgumentError(absl::StrCat(entry.cached.size(), " cached flags for ", world, " trainer ranks"));
  }
  if (entry.part_offset < 0) return absl::InvalidArgumentError(absl::StrCat("part offset ", entry.part_offset));
  for (size_t i = 0; i < plan.matrices.size(); ++i) {
    const MatrixPlan& m = plan.matrices[i];
    if (m.blocks.size() != w) {
      return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(static_cast<int>(i), m.name), " has ",
                                                     m.blocks.size(), " placements for ", world, " trainer ranks"));
    }
  }
  return absl::OkStatus();
}

LogEntry UnusableBatch(const LogEntry& entry, const absl::Status& why) {
  LogEntry failure;
  failure.index = entry.index;
  failure.generation = entry.generation;
  failure.key = entry.key;
  failure.status = absl::InternalError(absl::StrCat("step ", entry.key.ToString(),
                                                    ": the fleet coordinator's batch cannot be run here: ",
                                                    why.message()));
  failure.failure = kStepFailureInvalid;
  return failure;
}

}  // namespace orthoserve
