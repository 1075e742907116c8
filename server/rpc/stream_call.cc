// Implementation of server/rpc/stream_call.h.
#include "server/rpc/stream_call.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fleet_change.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/message_text.h"
#include "common/retry_after.h"
#include "proto/convert/grpc_status.h"
#include "server/rpc/region_slices.h"
#include "server/rpc/spec_codec.h"

namespace orthoserve {
namespace {

constexpr char kMethod[] = "OrthogonalizeStream";

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StreamCall::Start(ServiceState& state,
                                                                              grpc::CallbackServerContext* context) {
  std::shared_ptr<StreamCall> call(new StreamCall(state, context));
  call->self_ = call;
  call->Begin();
  return call.get();
}

StreamCall::StreamCall(ServiceState& state, grpc::CallbackServerContext* context)
    : s_(state), context_(context), services_(state.steps), spec_limits_(SpecLimitsOf(state.options)) {
  services_.method = kMethod;
}

void StreamCall::Begin() {
  s_.metrics->inflight_requests().Set(++s_.inflight);
  absl::Status admitted = Admit();
  if (!admitted.ok()) {
    RequestFinish(std::move(admitted));
    return;
  }
  watch_id_ = s_.watchdog.Register(weak_from_this());
  ReadNext();
}

absl::Status StreamCall::Admit() {
  if (s_.draining.load()) return absl::UnavailableError("the server is draining; retry on another rank");
  ASSIGN_OR_RETURN(tenant_, s_.auth->Authenticate(*context_));
  RETURN_IF_ERROR(s_.admission.AdmitCall(tenant_));
  ASSIGN_OR_RETURN(stream_slot_, s_.admission.AcquireStream(tenant_));
  return absl::OkStatus();
}

void StreamCall::ReadNext() {
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
    // Input is read continuously from the first read to the end of input (Handle never pauses
    // it), so one window runs from the first read.
    if (read_mark_ == absl::InfinitePast()) read_mark_ = absl::Now();
  }
  StartRead(&request_.raw);
}

void StreamCall::OnReadDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (ok) Progressed(static_cast<int64_t>(request_.raw.Length()), read_mark_, read_bytes_);
  }
  if (!ok) {
    InputEnded();
    return;
  }
  if (Handle()) ReadNext();
}

bool StreamCall::Handle() {
  if (absl::Status parsed = ParseStreamRequest(&request_); !parsed.ok()) {
    Fail(std::move(parsed));
    return false;
  }
  const v1::StreamRequest& message = request_.message;
  std::shared_ptr<Step> step;
  {
    absl::MutexLock lock(&mu_);
    step = step_;
  }
  if (step == nullptr) return OnHeader();
  switch (message.kind_case()) {
    case v1::StreamRequest::kSpec: return OnSpec(message.spec());
    case v1::StreamRequest::kChunk: return OnChunk(message.chunk().index());
    case v1::StreamRequest::kEnd: step->End(); return false;
    case v1::StreamRequest::kHeader: Fail(absl::InvalidArgumentError("a second StepHeader in one stream")); return false;
    default: Fail(absl::InvalidArgumentError("an empty StreamRequest")); return false;
  }
}

bool StreamCall::OnHeader() {
  const v1::StreamRequest& message = request_.message;
  if (!message.has_header()) {
    Fail(absl::InvalidArgumentError("the first message of a stream must be a StepHeader"));
    return false;
  }
  const v1::StepHeader& header = message.header();
  if (absl::Status limits = CheckHeaderLimits(header, s_.options); !limits.ok()) {
    s_.metrics->IntegrityRefused("limit");
    Fail(std::move(limits));
    return false;
  }
  absl::StatusOr<StepRequest> request = StepRequestFromHeader(header, tenant_, s_.options);
  if (!request.ok()) {
    Fail(request.status());
    return false;
  }
  if (request->attempt > 0) s_.metrics->StepRetried(kMethod);
  world_ = request->world;
  call_id_ = header.call_id();
  result_chunk_bytes_ = ResultChunkBytes(header.result_chunk_bytes(), s_.options.chunk_bytes);
  VLOG("rpc", 1) << "stream step rank " << request->rank << "/" << request->world << " " << request->num_matrices
                 << " matrices";
  absl::StatusOr<std::shared_ptr<Step>> step = OpenStep(services_, *std::move(request), shared_from_this());
  if (!step.ok()) {
    // A fleet change (this rank is not in a formed fleet generation) carries its mark: a retry elsewhere may work.
    RequestFinish(step.status());
    return false;
  }
  reader_step_ = *step;
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    step_ = *step;
    cancelled = cancelled_;
  }
  if (cancelled) {  // OnCancel came before the step existed.
    (*step)->Cancel(s_.draining.load());
    return false;
  }
  return true;
}

bool StreamCall::OnSpec(const v1::MatrixSpec& spec) {
  const int index = specs_++;
  // A spec over a metadata limit fails the stream (even a lone one, whose other bad specs are
  // answered in-band): its sizes are checked before anything is copied from it.
  if (absl::Status limits = CheckSpecLimits(spec, index, spec_limits_); !limits.ok()) {
    s_.metrics->IntegrityRefused("limit");
    Fail(std::move(limits));
    return false;
  }
  // Its metadata is admitted like data before the step stores it (the step keeps the name and
  // shape of a spec that does not parse too, for its in-band answer).
  const std::string what = MatrixLabel(index, spec.name());
  if (absl::Status admitted = s_.admission.AddBytes(bytes_, tenant_, SpecMetadataBytes(spec), what); !admitted.ok()) {
    Fail(std::move(admitted));
    return false;
  }
  absl::StatusOr<ParsedSpec> parsed = ParseMatrixSpec(spec, index, spec_limits_, /*whole_if_unset=*/world_ == 1);
  // Slices of shared-memory regions are leased here (region_slices.h); a bad one is answered like
  // a bad spec. Bytes in a region are the client's: they are not admitted.
  MatrixMemory memory;
  if (parsed.ok() && NamesRegion(spec)) {
    absl::StatusOr<MatrixMemory> leased = LeaseRegions(s_.regions, tenant_, call_id_, index, spec, *parsed, s_.metrics);
    if (leased.ok()) {
      memory = *std::move(leased);
    } else {
      parsed = leased.status();
    }
  }
  if (parsed.ok()) {
    const int64_t in_bytes = memory.input == nullptr ? parsed->block_bytes : 0;
    const int64_t out_bytes = memory.result == nullptr ? ResultBytes(*parsed) : 0;
    absl::Status admitted = s_.admission.AddBytes(bytes_, tenant_, in_bytes + out_bytes, what);
    if (!admitted.ok()) {
      Fail(std::move(admitted));
      return false;
    }
  }
  if (memory.input != nullptr || memory.result != nullptr) {
    if (memory.result != nullptr) {
      absl::MutexLock lock(&mu_);
      result_regions_[index] = spec.result_region();
    }
    return reader_step_->AddMatrixInMemory(*std::move(parsed), std::move(memory));
  }
  return reader_step_->AddMatrix(std::move(parsed), spec.name(), std::vector<int64_t>(spec.shape().begin(), spec.shape().end()));
}

bool StreamCall::OnChunk(int index) {
  int64_t size = 0;
  for (absl::string_view piece : request_.chunk_data) size += static_cast<int64_t>(piece.size());
  if (size > s_.options.chunk_bytes) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("matrix ", index, ": a chunk of ", size, " bytes exceeds the chunk limit of ", s_.options.chunk_bytes)));
    return false;
  }
  s_.metrics->BytesIn(kMethod, static_cast<double>(size));  // Received, even when the step skips it.
  s_.metrics->TenantBytes(tenant_, "in", static_cast<double>(size));
  return reader_step_->AddData(index, request_.chunk_data);
}

void StreamCall::InputEnded() {
  std::shared_ptr<Step> step;
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    step = step_;
    cancelled = cancelled_;
  }
  // A cancelled call's reads fail: OnCancel ends it.
  if (cancelled || context_->IsCancelled()) return;
  if (step == nullptr) {
    RequestFinish(absl::InvalidArgumentError("the stream ended before its StepHeader"));
    return;
  }
  step->End();  // Half-close ends the step like StepEnd.
}

void StreamCall::OnCancel() {
  std::shared_ptr<Step> step;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    step = step_;
  }
  if (step != nullptr) {
    step->Cancel(s_.draining.load());
  } else {
    RequestFinish(absl::CancelledError("the client cancelled the stream"));
  }
}

void StreamCall::Fail(absl::Status status) {
  std::shared_ptr<Step> step;
  {
    absl::MutexLock lock(&mu_);
    step = step_;
  }
  if (step != nullptr) {
    step->Fail(std::move(status));
  } else {
    RequestFinish(std::move(status));
  }
}

void StreamCall::Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
                        absl::string_view data, std::shared_ptr<const void> owner) {
  std::optional<v1::RegionSlice> region;
  {
    absl::MutexLock lock(&mu_);
    (status.ok() ? results_ok_ : results_failed_)++;
    if (auto it = result_regions_.find(index); it != result_regions_.end()) {
      region = std::move(it->second);
      result_regions_.erase(it);
    }
  }
  // A result written into the client's region goes back as its MatrixResult alone.
  std::vector<grpc::ByteBuffer> messages = ResultResponses(index, plan, block, status, data, owner,
                                                           result_chunk_bytes_, region ? &*region : nullptr);
  Enqueue(std::move(messages), status.ok() && !region ? static_cast<double>(data.size()) : 0);
}

void StreamCall::Finished(StepEnd end) {
  if (end.status.ok()) {
    int ok;
    int failed;
    {
      absl::MutexLock lock(&mu_);
      ok = results_ok_;
      failed = results_failed_;
    }
    std::vector<grpc::ByteBuffer> summary;
    summary.push_back(SummaryResponse(ok, failed, s_.steps.fleet->rank(), absl::Now() - start_));
    Enqueue(std::move(summary), 0);
  }
  RequestFinish(std::move(end.status));
}

void StreamCall::Enqueue(std::vector<grpc::ByteBuffer> messages, double data_bytes) {
  const grpc::ByteBuffer* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (output_ != Output::kOpen) return;  // Nobody will read it.
    for (size_t i = 0; i < messages.size(); ++i) {
      // A result's bytes are counted with its last message.
      queue_.push_back(Out{std::move(messages[i]), i + 1 == messages.size() ? data_bytes : 0});
    }
    if (!writing_ && !queue_.empty()) {
      writing_ = true;
      // Writing starts after a wait on the server (compute), which does not count: a new window.
      write_mark_ = absl::Now();
      written_bytes_ = 0;
      next = &queue_.front().message;
    }
  }
  // Outside the lock: gRPC may run OnWriteDone on this thread.
  if (next != nullptr) StartWrite(next);
}

void StreamCall::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  bool finish = false;
  double data_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    data_bytes = queue_.front().data_bytes;
    if (ok) Progressed(static_cast<int64_t>(queue_.front().message.Length()), write_mark_, written_bytes_);
    queue_.pop_front();
    if (!ok) {
      if (output_ == Output::kOpen) output_ = Output::kBroken;
      queue_.clear();  // The client is gone: the results' buffers are released.
    }
    if (!queue_.empty()) {
      next = &queue_.front().message;
    } else {
      writing_ = false;
      if (output_ == Output::kFinishing) {
        output_ = Output::kFinished;
        finish = true;
      }
    }
  }
  if (ok && data_bytes > 0) {
    s_.metrics->BytesOut(kMethod, data_bytes);
    s_.metrics->TenantBytes(tenant_, "out", data_bytes);
  }
  if (next != nullptr) {
    StartWrite(next);
  } else if (finish) {
    DoFinish();
  }
}

void StreamCall::RequestFinish(absl::Status status) {
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    if (output_ == Output::kFinishing || output_ == Output::kFinished) return;
    output_ = Output::kFinishing;
    finish_status_ = std::move(status);
    if (!writing_) {
      output_ = Output::kFinished;
      finish = true;
    }
  }
  if (finish) DoFinish();
}

void StreamCall::DoFinish() {
  // finish_status_ is no longer written once output_ is kFinished.
  // The fleet-change mark leaves the process as trailing metadata (the status payload does not).
  if (IsFleetChange(finish_status_)) context_->AddTrailingMetadata(kRetryableKey, kRetryableFleetChange);
  if (const auto delay = RetryAfter(finish_status_)) {
    context_->AddTrailingMetadata(kRetryAfterKey, std::to_string(absl::ToInt64Milliseconds(*delay)));
  }
  if (!finish_status_.ok()) VLOG("rpc", 1) << "stream failed: " << finish_status_;
  Finish(ToGrpcStatus(finish_status_));
}

absl::Time StreamCall::stalled_since() const {
  absl::MutexLock lock(&mu_);
  if (output_ == Output::kFinished) return absl::InfiniteFuture();
  if (writing_) return write_mark_;
  if (reading_) return read_mark_;
  return absl::InfiniteFuture();  // Waiting on the server (compute, the fleet).
}

void StreamCall::Progressed(int64_t bytes, absl::Time& mark, int64_t& moved) {
  moved += bytes;
  if (moved >= s_.options.stream_min_progress_bytes) {
    mark = absl::Now();
    moved = 0;
  }
}

void StreamCall::ProgressTimedOut(absl::Duration stalled) {
  bool writing;
  {
    absl::MutexLock lock(&mu_);
    writing = writing_;
  }
  const absl::Duration limit = s_.watchdog.timeout();
  const int64_t least = s_.options.stream_min_progress_bytes;
  const std::string message = absl::StrCat(
      "the stream moved fewer than ", least, " bytes in ",
      absl::FormatDuration(absl::Trunc(stalled, absl::Milliseconds(1))),
      writing ? ": the client did not read its results (or too slowly)"
              : ": the client sent too little while its next messages were awaited",
      " (--stream-progress-timeout = ", absl::FormatDuration(limit), ", --stream-min-progress-bytes = ", least, ")");
  LOG_INFO("rpc") << "tenant " << BoundedText(tenant_) << ": " << message;
  s_.metrics->TenantCut(tenant_, writing ? "not_reading" : "not_sending");
  if (writing) {
    // A write the client does not read never completes, and Finish would queue behind it: the
    // call is cancelled (the client sees CANCELLED), and OnCancel ends its step.
    context_->TryCancel();
    return;
  }
  Fail(absl::ResourceExhaustedError(message));
}

void StreamCall::OnDone() {
  s_.watchdog.Unregister(watch_id_);
  s_.metrics->inflight_requests().Set(--s_.inflight);
  s_.metrics->RequestDone(kMethod, CodeName(finish_status_.code()), absl::Now() - start_);
  stream_slot_.Release();
  bytes_.Release();
  reader_step_.reset();  // No read runs any more.
  std::shared_ptr<StreamCall> self;
  {
    absl::MutexLock lock(&mu_);
    step_.reset();  // The step's work in flight keeps its sink (this call) alive until it ends.
    self = std::move(self_);
  }
  // `self` may be the last reference: this call is destroyed on return.
}

}  // namespace orthoserve
