// FleetStep of server/step/step_impl.h: one trainer rank's part of a group step, handed to the
// fleet once every matrix has arrived. The step
// waits for its batch only while its client is there: Cancel (the client went away, its
// deadline passed, or the server's drain deadline cut the call) ends it at once, and the fleet
// drops its copy later.
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_digest.h"
#include "server/step/step_impl.h"

namespace orthoserve {

FleetStep::FleetStep(const StepServices& services, StepRequest request, std::shared_ptr<StepSink> sink, GroupKey key)
    : StepBase(services, std::move(request), std::move(sink)), key_(std::move(key)) {}

absl::StatusOr<char*> FleetStep::Destination(Matrix& m) {
  m.group_input.resize(static_cast<size_t>(m.spec.block_bytes));
  return m.group_input.data();
}

void FleetStep::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    // Before the fleet has it, the other ranks learn of the failure here rather than at their
    // rendezvous timeout; once submitted, the fleet aborts the step itself.
    if (!submitted_ && !finishing()) s_.fleet->AbortStep(key_, request_.rank, status, /*submission=*/0);
  }
  StepBase::Fail(std::move(status));
}

void FleetStep::InputEnded() {
  auto step = std::make_shared<TrainerStep>();
  step->key = key_;
  step->trainer_rank = request_.rank;
  step->trainer_world = request_.world;
  step->attempt = request_.attempt;
  step->submitted = absl::Now();
  std::vector<DigestedBlock> digested;
  digested.reserve(matrices_.size());
  for (const Matrix& m : matrices_) digested.push_back(DigestedBlock{m.spec.block, m.spec.plan.dtype, m.receiver.digest()});
  step->digest = StepDigest(digested);
  SpecList specs;
  std::vector<Block> blocks;
  specs.reserve(matrices_.size());
  blocks.reserve(matrices_.size());
  // The input has ended: nothing reads matrices_'s specs again, so they move into the step's list.
  for (Matrix& m : matrices_) {
    specs.push_back(std::move(m.spec.plan));  // Placements empty: the block goes beside it.
    blocks.push_back(m.spec.block);
    step->inputs.push_back(std::move(m.group_input));
  }
  TakeRegions(*step);
  step->sent = SenderBlocks(std::move(specs), std::move(blocks));
  {
    absl::MutexLock lock(&mu_);
    submitted_ = true;
    waiting_ = true;
  }
  s_.metrics->queue_depth().Increment();
  std::shared_ptr<StepBase> self = shared_from_this();
  // The callback may run before Submit returns (a fleet that cannot take the step).
  s_.fleet->Submit(step, [this, self, step](StepOutcome outcome) { OnOutcome(step, std::move(outcome)); });
  bool cancel;
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    submission_ = step->submission;  // Set by Submit.
    submission_known_ = true;
    cancel = cancel_deferred_;
    draining = cancel_draining_;
  }
  if (cancel) Cancel(draining);
}

void FleetStep::TakeRegions(TrainerStep& step) {
  std::vector<std::shared_ptr<const void>> leases;
  for (const Matrix& m : matrices_) {
    if (m.memory.owner != nullptr) leases.push_back(m.memory.owner);
  }
  if (leases.empty()) return;
  step.input_at.assign(matrices_.size(), nullptr);
  step.output_at.assign(matrices_.size(), nullptr);
  result_at_.assign(matrices_.size(), nullptr);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    step.input_at[i] = matrices_[i].memory.input;
    step.output_at[i] = matrices_[i].memory.result;
    result_at_[i] = matrices_[i].memory.result;
  }
  // Both the fleet's step (until the batch ran) and this step (until its results are delivered)
  // hold the leases: either may end first (a cancel, a batch still running).
  regions_ = std::make_shared<const std::vector<std::shared_ptr<const void>>>(std::move(leases));
  step.regions = regions_;
  step.region_spans = slices();  // The coordinator checks them against the other trainer ranks'.
}

void FleetStep::Cancel(bool draining) {
  bool abort = false;
  uint64_t submission = 0;
  {
    absl::MutexLock lock(&mu_);
    if (finishing()) return;
    if (waiting_ && !submission_known_) {
      // Submit has not returned yet: the abort needs the submission it assigns.
      cancel_deferred_ = true;
      cancel_draining_ = draining;
      return;
    }
    if (waiting_) {
      waiting_ = false;
      abort = true;
      submission = submission_;
    }
  }
  if (!abort) {
    // Still receiving: the step fails, and the other ranks are told.
    Fail(draining ? absl::UnavailableError("the server drained before the step ran")
                  : absl::CancelledError("the trainer cancelled its stream"));
    return;
  }
  s_.metrics->queue_depth().Decrement();
  // A drain is the server's doing: the other ranks keep waiting for this trainer's retry.
  s_.fleet->AbortStep(key_, request_.rank,
                      draining ? absl::UnavailableError("the server drained before the step ran")
                               : absl::CancelledError("the trainer cancelled its stream"),
                      submission);
  FinishWhenIdle(draining
                     ? StepEnd{MarkFleetChange(absl::UnavailableError("the server is draining; retry the step on another member"))}
                     : StepEnd{absl::CancelledError("the client cancelled the stream")});
}

void FleetStep::OnOutcome(std::shared_ptr<TrainerStep> step, StepOutcome outcome) {
  {
    absl::MutexLock lock(&mu_);
    if (!waiting_) return;  // Cancelled meanwhile: nobody waits for it.
    waiting_ = false;
  }
  s_.metrics->queue_depth().Decrement();
  s_.metrics->StageTime(Stage::kRendezvous, outcome.rendezvous_time);
  if (!outcome.status.ok()) {
    FinishWhenIdle(StepEnd{outcome.status});
    return;
  }
  Deliver(*step, step, outcome);
}

void FleetStep::Deliver(const TrainerStep& step, std::shared_ptr<TrainerStep> owner, const StepOutcome& outcome) {
  for (size_t i = 0; i < step.sent.size(); ++i) {
    const MatrixPlan& plan = step.sent.spec(i);
    const absl::Status& s = outcome.matrices[i];
    s_.metrics->MatrixDone(s_.method, AlgorithmName(plan.algorithm), DTypeName(plan.dtype), absl::StatusCodeToString(s.code()));
    if (i < result_at_.size() && result_at_[i] != nullptr) {
      // Written into the trainer's region by the batch: handed over where it is.
      const size_t bytes = static_cast<size_t>(step.sent.blocks[i].numel()) * ElementSize(plan.result_dtype);
      sink_->Result(static_cast<int>(i), plan, step.sent.blocks[i], s,
                    s.ok() ? absl::string_view(result_at_[i], bytes) : absl::string_view(), regions_);
      continue;
    }
    const std::vector<char>& out = step.outputs[i];
    sink_->Result(static_cast<int>(i), plan, step.sent.blocks[i], s,
                  s.ok() ? absl::string_view(out.data(), out.size()) : absl::string_view(),
                  std::shared_ptr<const void>(owner, out.data()));
  }
  FinishWhenIdle(StepEnd{});
}

}  // namespace orthoserve
