// OpenStep of server/step/step.h, and the input side every step shares (step_impl.h).
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/message_text.h"
#include "common/status.h"
#include "server/step/step_impl.h"

namespace orthoserve {

absl::StatusOr<std::shared_ptr<Step>> OpenStep(const StepServices& services, StepRequest request,
                                               std::shared_ptr<StepSink> sink) {
  StepFleet& fleet = *services.fleet;
  // A lone client is pipelined on this rank; on a formed fleet of S > 1 its matrices spread over
  // the members as they arrive (LoneStep asks the fleet where each goes).
  if (request.world == 1) return std::make_shared<LoneStep>(services, std::move(request), std::move(sink));
  if (!fleet.takes_group_steps()) {
    return MarkFleetChange(absl::UnavailableError(
        absl::StrCat("fleet rank ", fleet.rank(), " is not a member of a formed fleet generation (the fleet of up to ",
                     fleet.world(), " ranks is forming or re-forming); retry on a ready member")));
  }
  // Any member takes any trainer rank: clients spread a group over the members by preference,
  // and a retry goes wherever one is ready.
  GroupKey key{request.tenant, request.job, request.group, request.step, request.run};
  return std::make_shared<FleetStep>(services, std::move(request), std::move(sink), std::move(key));
}

StepBase::StepBase(const StepServices& services, StepRequest request, std::shared_ptr<StepSink> sink)
    : s_(services), request_(std::move(request)), sink_(std::move(sink)) {
  // The step layer's half of kMatrixOverheadBytes (step.h): a Matrix, and a group step's
  // submitted copy of its plan with its placement, input and output buffers and status.
  static_assert(sizeof(Matrix) + sizeof(MatrixPlan) + sizeof(BlockPlacement) + 2 * sizeof(std::vector<char>) +
                        sizeof(absl::Status) <=
                    kMatrixOverheadBytes / 2,
                "kMatrixOverheadBytes no longer covers a step's structures of one matrix");
}

bool StepBase::AddMatrix(absl::StatusOr<ParsedSpec> spec, absl::string_view name, std::vector<int64_t> shape) {
  if (finishing()) return false;
  absl::Status status = TakeMatrix(std::move(spec), name, std::move(shape));
  if (!status.ok()) Fail(std::move(status));
  return !finishing();
}

bool StepBase::AddData(int index, absl::Span<const absl::string_view> data) {
  if (finishing()) return false;
  absl::Status status = TakeData(index, data);
  if (!status.ok()) Fail(std::move(status));
  return !finishing();
}

void StepBase::End() {
  if (finishing()) return;
  s_.metrics->StageTime(Stage::kReceive, absl::Now() - start_);
  absl::Status whole = CheckWhole();
  if (!whole.ok()) {
    Fail(std::move(whole));
    return;
  }
  InputEnded();
}

void StepBase::Fail(absl::Status status) { FinishWhenIdle(StepEnd{std::move(status)}); }

bool StepBase::AddMatrixInMemory(ParsedSpec spec, MatrixMemory memory) {
  if (finishing()) return false;
  absl::Status status = TakeMatrixInMemory(std::move(spec), std::move(memory));
  if (!status.ok()) Fail(std::move(status));
  return !finishing();
}

absl::StatusOr<int> StepBase::NextIndex() const {
  if (current_ >= 0 && !matrices_[current_].failed && !matrices_[current_].receiver.complete()) {
    const Matrix& m = matrices_[current_];
    return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(current_, m.spec.plan.name), ": received ",
                                                   m.receiver.received(), " of its ", m.spec.block_bytes,
                                                   " bytes before the next spec"));
  }
  const int index = static_cast<int>(matrices_.size());
  if (index >= request_.num_matrices) {
    return absl::InvalidArgumentError(absl::StrCat("more specs than the header's num_matrices = ", request_.num_matrices));
  }
  return index;
}

absl::Status StepBase::RecordSlices(int index, const ParsedSpec& spec, const MatrixMemory& memory) {
  std::vector<SpanUse> mine;
  if (memory.input != nullptr) mine.push_back(SpanUse{memory.input_span, false, request_.rank, index});
  if (memory.result != nullptr) mine.push_back(SpanUse{memory.result_span, true, request_.rank, index});
  for (const SpanUse& a : mine) {
    for (const SpanUse& b : slices_) {
      if (!(a.writes || b.writes) || !a.span.Overlaps(b.span)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          MatrixLabel(index, spec.plan.name), " ", a.writes ? "result_region" : "input_region", " overlaps the ",
          b.writes ? "result_region" : "input_region", " of ", MatrixLabel(b.matrix, matrices_[b.matrix].spec.plan.name),
          " (a step may write one matrix's result before it reads or writes another's slice)"));
    }
  }
  slices_.insert(slices_.end(), mine.begin(), mine.end());
  return absl::OkStatus();
}

absl::Status StepBase::TakeMatrixInMemory(ParsedSpec spec, MatrixMemory memory) {
  ASSIGN_OR_RETURN(const int index, NextIndex());
  const bool on_device = memory.input_space == MemorySpace::kDevice || memory.result_space == MemorySpace::kDevice;
  if (on_device && !lone()) {
    return absl::FailedPreconditionError(absl::StrCat(MatrixLabel(index, spec.plan.name),
                                                      " names a CUDA IPC region (GPU memory): those are served for "
                                                      "lone clients and unary calls only, not (yet) in group steps"));
  }
  RETURN_IF_ERROR(RecordSlices(index, spec, memory));
  matrices_.emplace_back();
  current_ = index;
  Matrix& m = matrices_.back();
  m.spec = std::move(spec);
  m.parsed = true;
  m.memory = std::move(memory);
  if (on_device && s_.backend->memory().space() != MemorySpace::kDevice) {
    m.receiver = BlockReceiver(m.spec.plan.dtype, nullptr, m.spec.block_bytes);
    m.receiver.TakeScanned(-1);  // Nothing of it is read: it is answered now.
    return Reject(index,
                  absl::FailedPreconditionError(absl::StrCat(MatrixLabel(index, m.spec.plan.name),
                                                             " names a CUDA IPC region (GPU memory), but this "
                                                             "server computes on the ",
                                                             s_.backend->Info().name, " backend, in host memory")));
  }
  if (m.memory.input != nullptr && m.memory.input_space == MemorySpace::kDevice) {
    // Scanned on the device, where it stays; only the verdict comes to the host.
    m.receiver = BlockReceiver(m.spec.plan.dtype, nullptr, m.spec.block_bytes);
    const int64_t elements = m.spec.block_bytes / static_cast<int64_t>(ElementSize(m.spec.plan.dtype));
    absl::StatusOr<int64_t> bad = s_.backend->memory().FindNonFinite(m.memory.input, m.spec.plan.dtype, elements);
    if (!bad.ok()) {
      m.receiver.TakeScanned(-1);
      return Reject(index, Annotate(bad.status(), absl::StrCat(MatrixLabel(index, m.spec.plan.name),
                                                               " input_region: the NaN/Inf scan on the device")));
    }
    m.receiver.TakeScanned(*bad);
    return Completed(index);
  }
  // A group step's blocks are digested, in a region as in bytes (a retry must carry the same ones).
  if (m.memory.input != nullptr) {
    m.receiver = BlockReceiver(m.spec.plan.dtype, nullptr, m.spec.block_bytes, /*digest=*/!lone());
    if (lone() && !request_.all_or_nothing && s_.backend->FailsNonFiniteInput()) {
      // Read once, by the computation, which fails on a NaN or Inf (LoneStep::Compute then finds
      // the element): a pass over the block here would be a third one for steps = 0.
      m.receiver.TakeUnscanned();
    } else {
      m.receiver.TakeInPlace(m.memory.input);
    }
    return Completed(index);
  }
  ASSIGN_OR_RETURN(char* dst, Destination(m));
  m.receiver = BlockReceiver(m.spec.plan.dtype, dst, m.spec.block_bytes, /*digest=*/!lone());
  if (m.spec.block_bytes == 0) return Completed(index);
  return absl::OkStatus();
}

absl::Status StepBase::TakeMatrix(absl::StatusOr<ParsedSpec> spec, absl::string_view name,
                                  std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(const int index, NextIndex());
  matrices_.emplace_back();
  current_ = index;
  Matrix& m = matrices_.back();
  if (!spec.ok()) {
    m.spec.plan.name = std::string(name);
    m.spec.plan.shape = std::move(shape);
    return Reject(index, spec.status());
  }
  m.spec = *std::move(spec);
  m.parsed = true;
  ASSIGN_OR_RETURN(char* dst, Destination(m));
  // A group step's blocks are digested as they arrive (a retry must carry the same ones).
  m.receiver = BlockReceiver(m.spec.plan.dtype, dst, m.spec.block_bytes, /*digest=*/!lone());
  if (m.spec.block_bytes == 0) return Completed(index);
  return absl::OkStatus();
}

absl::Status StepBase::TakeData(int index, absl::Span<const absl::string_view> data) {
  if (current_ < 0 || index != current_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a data chunk for matrix ", index, " arrived while matrix ", current_, " was expected"));
  }
  Matrix& m = matrices_[current_];
  if (m.failed) return absl::OkStatus();  // Answered in-band already: its bytes are skipped.
  int64_t size = 0;
  for (absl::string_view piece : data) size += static_cast<int64_t>(piece.size());
  if (m.receiver.received() + size > m.spec.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(current_, m.spec.plan.name), ": received more than its ",
                                                   m.spec.block_bytes, " bytes (block ", m.spec.block.rows, "x",
                                                   m.spec.block.cols, " of ", DTypeName(m.spec.plan.dtype), ")"));
  }
  for (absl::string_view piece : data) m.receiver.Append(piece);
  if (m.receiver.complete()) return Completed(current_);
  return absl::OkStatus();
}

absl::Status StepBase::Completed(int index) {
  Matrix& m = matrices_[index];
  const int64_t bad = m.receiver.first_non_finite();
  if (bad >= 0) return Reject(index, NonFiniteData(index, m, bad));
  return Complete(index);
}

absl::Status StepBase::NonFiniteData(int index, const Matrix& m, int64_t element) {
  return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(index, m.spec.plan.name),
                                                 " data holds a non-finite value (NaN or Inf) at element ", element,
                                                 " of its block"));
}

absl::Status StepBase::CheckWhole() const {
  if (static_cast<int>(matrices_.size()) < request_.num_matrices) {
    return absl::InvalidArgumentError(absl::StrCat("the step ended after ", matrices_.size(), " of the header's ",
                                                   request_.num_matrices, " matrices"));
  }
  if (current_ >= 0 && !matrices_[current_].failed && !matrices_[current_].receiver.complete()) {
    const Matrix& m = matrices_[current_];
    return absl::InvalidArgumentError(absl::StrCat(MatrixLabel(current_, m.spec.plan.name), ": the step ended after ",
                                                   m.receiver.received(), " of its ", m.spec.block_bytes,
                                                   " bytes (block ", m.spec.block.rows, "x", m.spec.block.cols, " of ",
                                                   DTypeName(m.spec.plan.dtype), ")"));
  }
  return absl::OkStatus();
}

void StepBase::BeginWork() {
  absl::MutexLock lock(&mu_);
  ++work_;
}

void StepBase::EndWork() {
  mu_.Lock();
  --work_;
  MaybeFinishAndUnlock();
}

void StepBase::FinishWhenIdle(StepEnd end) {
  mu_.Lock();
  if (end_set_) {
    mu_.Unlock();
    return;
  }
  end_set_ = true;
  end_ = std::move(end);
  finishing_.store(true);
  MaybeFinishAndUnlock();
}

void StepBase::MaybeFinishAndUnlock() {
  if (!end_set_ || work_ > 0 || finished_) {
    mu_.Unlock();
    return;
  }
  finished_ = true;
  StepEnd end = std::move(end_);
  mu_.Unlock();
  sink_->Finished(std::move(end));
}

}  // namespace orthoserve
