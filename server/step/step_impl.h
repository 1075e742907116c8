// The two Step implementations of server/step/step.h and what they share: receiving a step's
// matrices in order (specs, then each block's bytes, checked against the header and the spec),
// and ending exactly once. Private to server/step.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/step/block_receiver.h"
#include "server/step/step.h"

namespace orthoserve {

class StepBase : public Step, public std::enable_shared_from_this<StepBase> {
 public:
  StepBase(const StepServices& services, StepRequest request, std::shared_ptr<StepSink> sink);

  bool AddMatrix(absl::StatusOr<ParsedSpec> spec, absl::string_view name, std::vector<int64_t> shape) final;
  bool AddMatrixInMemory(ParsedSpec spec, MatrixMemory memory) final;
  bool AddData(int index, absl::Span<const absl::string_view> data) final;
  void End() final;
  void Fail(absl::Status status) override;

 protected:
  struct Matrix {
    ParsedSpec spec;
    bool parsed = false;                  // The spec was valid (`spec` holds it).
    bool failed = false;                  // Rejected in-band (lone): its chunks are skipped.
    std::shared_ptr<PooledBuffer> input;  // Lone: the block's bytes.
    std::vector<char> group_input;        // Fleet: the block's bytes, handed to the fleet.
    MatrixMemory memory;                  // Lone: input and/or result in a shared-memory region.
    BlockReceiver receiver;
  };

  // Matrix `index` could not be taken (bad spec or data): OK when the step answers it in-band
  // and goes on (matrices_[index].failed is then set), or the status that fails the step.
  // Reject, Destination, Complete and InputEnded run on the reader's thread.
  virtual absl::Status Reject(int index, absl::Status status) = 0;
  // Where matrix `index`'s block bytes go.
  virtual absl::StatusOr<char*> Destination(Matrix& m) = 0;
  // Matrix `index`'s bytes are all in and finite.
  virtual absl::Status Complete(int index) = 0;
  // Every matrix arrived whole (End, after the checks).
  virtual void InputEnded() = 0;

  // The answer for matrix `index` (`m`) whose block holds a NaN or Inf at `element`
  // (INVALID_ARGUMENT). Callable from any thread.
  static absl::Status NonFiniteData(int index, const Matrix& m, int64_t element);

  // Work in progress that must end before the step may finish (compute jobs of a lone step).
  void BeginWork();
  void EndWork();
  // Ends the step with `end` once no work is in progress (at once if none is). The first call
  // decides; later ones are ignored. A failure before the input ended stops the input.
  void FinishWhenIdle(StepEnd end);
  bool finishing() const { return finishing_.load(); }
  // The step's shared-memory slices so far (reader's thread), as RecordSlices recorded them.
  const std::vector<SpanUse>& slices() const { return slices_; }

  const StepServices s_;
  const StepRequest request_;
  const std::shared_ptr<StepSink> sink_;
  const absl::Time start_ = absl::Now();
  // One per spec received so far, appended by the reader only. Nothing is reserved from the
  // header's num_matrices (it is not admitted): a deque grows as specs arrive (each admitted
  // first) without moving its elements, so a Matrix& stays valid for the step's life. Compute
  // and fleet threads use such references (taken on the reader's thread) and never index the
  // deque, whose bookkeeping an append on the reader's thread may change meanwhile.
  std::deque<Matrix> matrices_;

 private:
  absl::Status TakeMatrix(absl::StatusOr<ParsedSpec> spec, absl::string_view name, std::vector<int64_t> shape);
  absl::Status TakeMatrixInMemory(ParsedSpec spec, MatrixMemory memory);
  // Records the shared-memory slices of matrix `index` (`memory`) in slices_; INVALID_ARGUMENT
  // (recording nothing) when one overlaps a slice of an earlier matrix of the step where either is
  // a result: a step (lone, unary or group) may write one matrix's result before it reads
  // another's input, or write two results into the same bytes, so the answer would not be the
  // caller's. Inputs may overlap inputs (both only read); a matrix's own input and result are
  // checked at ingress (region_slices.h). Compares the slices' SharedSpans, so that one memfd
  // registered as two regions (or on two servers) is one memory. A group step's slices are also
  // checked against the other trainer ranks' by the coordinator (TrainerStep::region_spans).
  absl::Status RecordSlices(int index, const ParsedSpec& spec, const MatrixMemory& memory);
  // The previous matrix got all its bytes, and there is room for one more: its index.
  absl::StatusOr<int> NextIndex() const;
  absl::Status TakeData(int index, absl::Span<const absl::string_view> data);
  absl::Status CheckWhole() const;
  // Runs Complete, or Reject for a block holding NaN or Inf.
  absl::Status Completed(int index);
  // Hands the end to the sink once it is set and no work is in progress (once); releases mu_
  // before the sink runs.
  void MaybeFinishAndUnlock() ABSL_UNLOCK_FUNCTION(mu_);

  int current_ = -1;  // The matrix whose bytes are arriving (reader only).
  // The shared-memory slices of the matrices taken so far (reader only), for RecordSlices: kept
  // for the step's life, apart from the matrices' MatrixMemory, which a lone matrix's compute
  // thread lets go of once it is computed.
  std::vector<SpanUse> slices_;
  std::atomic<bool> finishing_{false};
  absl::Mutex mu_;
  int work_ ABSL_GUARDED_BY(mu_) = 0;
  bool end_set_ ABSL_GUARDED_BY(mu_) = false;
  StepEnd end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A lone client (W = 1), pipelined: each matrix computed here or, on a formed fleet of S > 1, on
// the member the fleet picks, as soon as its bytes are in (lone_step.cc).
class LoneStep final : public StepBase {
 public:
  using StepBase::StepBase;
  void Cancel(bool draining) override;
  bool lone() const override { return true; }

 private:
  absl::Status Reject(int index, absl::Status status) override;
  absl::StatusOr<char*> Destination(Matrix& m) override;
  absl::Status Complete(int index) override;
  void InputEnded() override;
  // Sends matrix `index`, whose bytes are all in, to where the fleet places it (reader's thread).
  void Place(int index);
  // Computes matrix `index` (`m`, matrices_[index]) here, in the compute queue; `target` (this
  // rank's load, or null for a matrix a peer could not compute) is held until done. Callable
  // from any thread.
  void ComputeHere(int index, Matrix& m, std::shared_ptr<const LoneTarget> target);
  void Compute(int index, Matrix& m, absl::Time queued);
  // Has a peer compute matrix `index` (it is computed here if the peer cannot).
  void Forward(int index, Matrix& m, std::shared_ptr<const LoneTarget> target);
  // Hands matrix `index`'s result to the sink.
  void Deliver(int index, const Matrix& m, const absl::Status& status, absl::string_view data,
               std::shared_ptr<const void> owner);

  std::string job_;  // The compute queue's job: the header's, or this step alone.
  std::vector<int> held_;  // All or nothing: the matrices complete so far, placed at the end (reader only).
  std::atomic<bool> cancelled_{false};
};

// A group step (W > 1), run by the fleet's batches (fleet_step.cc).
class FleetStep final : public StepBase {
 public:
  FleetStep(const StepServices& services, StepRequest request, std::shared_ptr<StepSink> sink, GroupKey key);
  void Fail(absl::Status status) override;
  void Cancel(bool draining) override;
  bool lone() const override { return false; }

 private:
  absl::Status Reject(int index, absl::Status status) override { return status; }
  absl::StatusOr<char*> Destination(Matrix& m) override;
  absl::Status Complete(int) override { return absl::OkStatus(); }
  void InputEnded() override;
  // Hands the matrices' shared-memory slices (MatrixMemory) to `step` (TrainerStep::input_at,
  // output_at, regions) and keeps what Deliver needs of them (reader's thread, before Submit).
  void TakeRegions(TrainerStep& step);
  void OnOutcome(std::shared_ptr<TrainerStep> step, StepOutcome outcome);
  void Deliver(const TrainerStep& step, std::shared_ptr<TrainerStep> owner, const StepOutcome& outcome);

  const GroupKey key_;
  // Set by TakeRegions before Submit, read-only after: where each matrix's result is written in
  // the trainer's region (null: in the step's outputs; empty: no result in a region), and the
  // leases of every slice of the step.
  std::vector<char*> result_at_;
  std::shared_ptr<const void> regions_;
  absl::Mutex mu_;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;  // The fleet has the step (it aborts it itself on failure).
  uint64_t submission_ ABSL_GUARDED_BY(mu_) = 0;
  bool submission_known_ ABSL_GUARDED_BY(mu_) = false;  // Submit returned (submission_ is set).
  bool cancel_deferred_ ABSL_GUARDED_BY(mu_) = false;   // Cancel came while Submit ran; done when it returns.
  bool cancel_draining_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // Counted in the queue depth until the outcome or a cancel.
};

}  // namespace orthoserve
