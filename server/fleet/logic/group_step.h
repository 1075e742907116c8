// One trainer rank's part of a group step, as the RPC layer hands it to the fleet, and the
// outcome the fleet hands back. No gRPC here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/fleet_change.h"
#include "common/shared_span.h"
#include "common/shape.h"
#include "server/plan/matrix_plan.h"

namespace orthoserve {

// Identifies a step of a trainer group: (tenant, job, group name, step number) and the run of
// the trainers (StepHeader.run_id; "" for an old client's, where the server allows those). Two
// runs of one job never share a step: the coordinator refuses a report of one run for a step
// another run's ranks are gathering (Coordinator, "Runs").
struct GroupKey {
  std::string tenant;
  std::string job;
  std::string group;
  int64_t step = 0;
  std::string run;

  bool operator==(const GroupKey& o) const {
    return step == o.step && tenant == o.tenant && job == o.job && group == o.group && run == o.run;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GroupKey& k) {
    return H::combine(std::move(h), k.tenant, k.job, k.group, k.step, k.run);
  }
  // "tenant/job/group@step" for logs and messages (each part shortened when long; the run is
  // named apart, see RunText).
  std::string ToString() const;
  // The group this is a step of (step 0), of the same run.
  GroupKey Group() const { return GroupKey{tenant, job, group, 0, run}; }
  // The same step of any run: what two runs' reports must not share.
  GroupKey AnyRun() const { return GroupKey{tenant, job, group, step, ""}; }
};

// How messages name a run: "run \"ID\"" (shortened when long), or "a client that sent no run id".
std::string RunText(const std::string& run);

// A step's spec list as its senders sent it (placements empty), shared: one list goes from the
// ingress through the executor to the coordinator, never copied in process, and every report of
// a step that sent an identical list shares the first one there.
using SpecList = std::vector<MatrixPlan>;
using SharedSpecs = std::shared_ptr<const SpecList>;

// One sender's (trainer rank's) part of a step: the step's shared spec list and this sender's
// block of each of its matrices — the one carrier of "this sender's blocks of this plan" from the
// step layer to the coordinator. Invariant: specs is not null and specs->size() == blocks.size().
struct SenderBlocks {
  SharedSpecs specs = std::make_shared<const SpecList>();
  std::vector<Block> blocks;  // blocks[i]: of (*specs)[i].

  SenderBlocks() = default;
  SenderBlocks(SharedSpecs s, std::vector<Block> b) : specs(std::move(s)), blocks(std::move(b)) {}
  SenderBlocks(SpecList s, std::vector<Block> b)
      : specs(std::make_shared<const SpecList>(std::move(s))), blocks(std::move(b)) {}
  size_t size() const { return blocks.size(); }
  const MatrixPlan& spec(size_t i) const { return (*specs)[i]; }
};

// What one trainer rank sent for a step: its blocks of the step's specs (`sent`). `inputs[i]`
// holds block i's bytes in spec(i).dtype (empty for an empty block or a matrix rejected before
// its data arrived); `outputs[i]` is filled by the fleet with the result block in result_dtype.
//
// Blocks in the trainer's shared-memory regions (docs/shared_memory.md; host memory mapped in
// this process, leased by the step layer): `input_at[i]` not null means block i's input is read
// there in place (inputs[i] is empty), `output_at[i]` not null that its result is written there
// (outputs[i] stays empty). Both are empty when no block is in a region. `regions` keeps them
// valid. The executor reads them on its applier thread only, and lets them go when it keeps the
// step for replays (TakeRegionInputs): a kept step holds its own copy of every input, and no
// lease, so that UnregisterRegion never waits for the replay cache and a replay never writes
// into the region of an attempt that is over.
struct TrainerStep {
  GroupKey key;
  int trainer_rank = 0;
  int trainer_world = 1;
  int attempt = 0;          // The client's attempt number (StepHeader.attempt).
  uint64_t submission = 0;  // Set by the executor: identifies this submission in reports and the log.
  uint64_t digest = 0;      // Of the blocks' bytes, in order (BlockDigest, computed as they arrived).
  SenderBlocks sent;
  std::vector<std::vector<char>> inputs;
  std::vector<std::vector<char>> outputs;
  std::vector<const char*> input_at;
  std::vector<char*> output_at;
  std::shared_ptr<const void> regions;
  // The slices of this trainer rank's blocks as every process on the host names them (who: the
  // trainer rank; matrix: the index), reported to the coordinator, which fails the step when a
  // result slice of one rank overlaps any slice of another (Rendezvous, before anything is
  // written). Empty when no block is in a region.
  std::vector<SpanUse> region_spans;
  absl::Time submitted;

  // Block i's input bytes, wherever they are.
  absl::string_view input(size_t i) const {
    if (i < input_at.size() && input_at[i] != nullptr) {
      const int64_t n = sent.blocks[i].numel() * static_cast<int64_t>(ElementSize(sent.spec(i).dtype));
      return absl::string_view(input_at[i], static_cast<size_t>(n > 0 ? n : 0));
    }
    return absl::string_view(inputs[i].data(), inputs[i].size());
  }
  // Where block i's result is written by the fleet: its region slice, or null (outputs[i]).
  char* output_in_region(size_t i) const { return i < output_at.size() ? output_at[i] : nullptr; }
};

// Copies the inputs `step` still reads from shared-memory regions into step.inputs and lets the
// regions go (input_at, output_at and regions cleared). True when the inputs are the bytes the
// step was digested from (step.digest); false when the client changed a region since (its own
// result is then of inconsistent input, as for a lone step), and such a step must not be kept for
// replays: a replay from it would give a retry a result of other inputs than the original's.
// A step with no block in a region is left as it is (true). Not thread-safe on `step`.
bool TakeRegionInputs(TrainerStep& step);

// The result of a step for one trainer rank. `status` not OK: the whole step failed (ABORTED
// for a rendezvous timeout or another rank's failure, INVALID_ARGUMENT for specs that differ
// between ranks or a bad group, UNAVAILABLE for a fleet failure); otherwise `matrices` holds
// one status per matrix. A failure that came from a change of the fleet (a retry of the whole
// step may succeed) carries the mark of MarkFleetChange (common/fleet_change.h).
struct StepOutcome {
  absl::Status status;
  std::vector<absl::Status> matrices;
  absl::Duration rendezvous_time;
  absl::Duration queue_time;
  absl::Duration collective_time;
  absl::Duration compute_time;
};

using StepCallback = std::function<void(StepOutcome)>;

}  // namespace orthoserve
