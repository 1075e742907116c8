// Implementation of server/rpc/unary_call.h.
#include "server/rpc/unary_call.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fleet_change.h"
#include "common/logging.h"
#include "common/message_text.h"
#include "common/retry_after.h"
#include "common/status.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/convert/grpc_status.h"
#include "proto/convert/ns_options_proto.h"
#include "proto/convert/raw_message.h"
#include "server/rpc/region_slices.h"
#include "server/rpc/spec_codec.h"
#include "server/rpc/stream_codec.h"

namespace orthoserve {
namespace {

constexpr char kMethod[] = "Orthogonalize";

}  // namespace

grpc::ServerGenericBidiReactor* UnaryCall::Start(ServiceState& state, grpc::CallbackServerContext* context) {
  std::shared_ptr<UnaryCall> call(new UnaryCall(state, context));
  call->self_ = call;
  state.metrics->inflight_requests().Set(++state.inflight);
  call->Begin();
  return call.get();
}

UnaryCall::UnaryCall(ServiceState& state, grpc::CallbackServerContext* context)
    : s_(state), context_(context), services_(state.steps) {
  services_.method = kMethod;
  // The RPC layer's half of kMatrixOverheadBytes (server/step/step.h): a matrix's view of the
  // request, its parsed spec (moved into the step, its shell kept), its result slot and its
  // response header.
  static_assert(
      sizeof(MatrixInPlace) + sizeof(ParsedSpec) + sizeof(Slot) + sizeof(UnaryResult) <= kMatrixOverheadBytes / 2,
      "kMatrixOverheadBytes no longer covers a unary call's structures of one matrix");
}

void UnaryCall::Begin() {
  if (s_.draining.load()) {
    End(absl::UnavailableError("the server is draining; retry on another rank"));
    return;
  }
  absl::StatusOr<std::string> tenant = s_.auth->Authenticate(*context_);
  if (!tenant.ok()) {
    End(tenant.status());
    return;
  }
  tenant_ = *std::move(tenant);
  if (absl::Status admitted = s_.admission.AdmitCall(tenant_); !admitted.ok()) {
    End(std::move(admitted));
    return;
  }
  std::weak_ptr<UnaryCall> weak = weak_from_this();
  const uint64_t id = s_.unary_gate.Acquire(&slot_, tenant_, [weak](absl::Status status) {
    if (std::shared_ptr<UnaryCall> call = weak.lock()) call->OnSlot(std::move(status));
  });
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    slot_wait_id_ = id;
    cancel = cancelled_ && id != 0;
  }
  // OnCancel came before the wait had its id.
  if (cancel && s_.unary_gate.CancelWait(id)) End(absl::CancelledError("the client cancelled the call"));
}

void UnaryCall::OnSlot(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    slot_wait_id_ = 0;
    if (status.ok() && cancelled_) status = absl::CancelledError("the client cancelled the call");
  }
  if (!status.ok()) {
    End(std::move(status));
    return;
  }
  Reserve();
}

void UnaryCall::Reserve() {
  std::weak_ptr<UnaryCall> weak = weak_from_this();
  // Room for the largest request and response there can be, or the whole budget when that is
  // smaller (unary bodies are then read one at a time, and one larger than what is left after the
  // read is refused when its real size is admitted).
  const uint64_t id = s_.admission.AddBytesWhenAvailable(
      &bytes_, tenant_, UnaryReservationBytes(s_.options),
      "a unary call (its request and response, each up to --max-message-bytes)", [weak](absl::Status status) {
        if (std::shared_ptr<UnaryCall> call = weak.lock()) call->OnReserved(std::move(status));
      });
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    wait_id_ = id;
    cancel = cancelled_ && id != 0;
  }
  // OnCancel came before the wait had its id.
  if (cancel && s_.admission.CancelWait(id)) End(absl::CancelledError("the client cancelled the call"));
}

void UnaryCall::OnReserved(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    wait_id_ = 0;
    if (status.ok() && cancelled_) status = absl::CancelledError("the client cancelled the call");
  }
  if (!status.ok()) {
    End(std::move(status));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
    reading_since_ = absl::Now();
  }
  watch_id_ = s_.watchdog.Register(weak_from_this());
  StartRead(&request_bytes_);
}

absl::Time UnaryCall::stalled_since() const {
  absl::MutexLock lock(&mu_);
  return reading_ && !ended_ ? reading_since_ : absl::InfiniteFuture();
}

void UnaryCall::ProgressTimedOut(absl::Duration stalled) {
  const std::string message = absl::StrCat(
      "the unary call's request did not arrive within ", absl::FormatDuration(absl::Trunc(stalled, absl::Milliseconds(1))),
      " of its room being reserved (--stream-progress-timeout = ", absl::FormatDuration(s_.watchdog.timeout()), ")");
  LOG_INFO("rpc") << "tenant " << BoundedText(tenant_) << ": " << message;
  s_.metrics->TenantCut(tenant_, "unary_request");
  End(absl::ResourceExhaustedError(message));
}

void UnaryCall::OnReadDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
  }
  if (!ok) {
    End(context_->IsCancelled() ? absl::CancelledError("the client cancelled the call")
                                : absl::InvalidArgumentError("the call ended before its request"));
    return;
  }
  absl::Status status = Run();
  if (!status.ok()) End(std::move(status));
}

absl::Status UnaryCall::Run() {
  {
    // The data bytes are viewed where gRPC received them, not copied (request_bytes_ keeps them).
    grpc::ProtoBufferReader reader(&request_bytes_);
    if (!reader.status().ok() || !ReadMatricesInPlace(&reader, &request_, &call_id_)) {
      return absl::InvalidArgumentError("the request is not an OrthogonalizeRequest");
    }
  }
  if (call_id_.size() > static_cast<size_t>(s_.options.max_name_bytes)) {
    s_.metrics->IntegrityRefused("limit");
    return absl::InvalidArgumentError(absl::StrCat("the request's call_id has ", call_id_.size(), " bytes; at most ",
                                                   s_.options.max_name_bytes, " are accepted (--max-name-bytes)"));
  }
  const int n = static_cast<int>(request_.size());
  if (n == 0) return absl::InvalidArgumentError("the request holds no matrices");
  if (n > s_.options.max_matrices_per_step) {
    s_.metrics->IntegrityRefused("limit");
    return absl::InvalidArgumentError(absl::StrCat("the request holds ", n, " matrices; at most ",
                                                   s_.options.max_matrices_per_step,
                                                   " are accepted per call (--max-matrices-per-step)"));
  }
  // Parse and check every spec (sizes before any allocation), then admit the bytes (data and
  // metadata), then hand the matrices to an all-or-nothing step, which checks each one's data
  // (length, NaN and Inf) as it copies it and computes nothing unless all pass. The request
  // itself is within the reservation already.
  const SpecLimits limits = SpecLimitsOf(s_.options);
  std::vector<ParsedSpec> parsed;
  std::vector<MatrixMemory> memories;
  int64_t bytes = 0;
  int64_t out_bytes = 0;
  for (int i = 0; i < n; ++i) {
    const MatrixInPlace& m = request_[static_cast<size_t>(i)];
    v1::MatrixSpec spec;
    if (!spec.ParseFromString(m.spec)) {
      return absl::InvalidArgumentError(absl::StrCat("matrix ", i, ": its spec is not a MatrixSpec"));
    }
    if (absl::Status over = CheckSpecLimits(spec, i, limits); !over.ok()) {
      s_.metrics->IntegrityRefused("limit");
      return over;
    }
    ASSIGN_OR_RETURN(ParsedSpec p, ParseMatrixSpec(spec, i, limits, /*whole_if_unset=*/true));
    const std::string what = MatrixLabel(i, spec.name());
    if (!(p.block == WholeBlock(p.plan.view))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " block: a unary call carries whole matrices; send blocks "
                                                           "of a group through OrthogonalizeStream"));
    }
    // A slice of a shared-memory region instead of data, for the input or the result: leased
    // here (region_slices.h checks it), read and written in place by the step, and not counted
    // as bytes the server holds.
    MatrixMemory memory;
    if (NamesRegion(spec)) {
      if (spec.has_input_region() && m.data_bytes != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " carries data and names an input_region; send one or the other"));
      }
      ASSIGN_OR_RETURN(memory, LeaseRegions(s_.regions, tenant_, call_id_, i, spec, p, s_.metrics));
      if (spec.has_result_region()) {
        result_regions_.resize(static_cast<size_t>(n));
        result_regions_[static_cast<size_t>(i)] = spec.result_region();
      }
    }
    const int64_t result_bytes = p.plan.view.numel() * static_cast<int64_t>(ElementSize(p.plan.result_dtype));
    if (memory.result == nullptr) out_bytes += result_bytes;
    bytes += SpecMetadataBytes(spec) + (memory.input == nullptr ? p.block_bytes : 0) +
             (memory.result == nullptr ? result_bytes : 0);
    parsed.push_back(std::move(p));
    memories.push_back(std::move(memory));
  }
  if (out_bytes > s_.options.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the results would take ", out_bytes, " bytes, more than a response may hold (--max-message-bytes = ",
        s_.options.max_message_bytes, "); send them through OrthogonalizeStream"));
  }
  // The reservation becomes what the call holds: its inputs and results (never more).
  RETURN_IF_ERROR(s_.admission.Resize(bytes_, tenant_, bytes, "this request"));
  s_.metrics->BytesIn(kMethod, static_cast<double>(request_bytes_.Length()));
  s_.metrics->TenantBytes(tenant_, "in", static_cast<double>(request_bytes_.Length()));

  StepRequest step_request;
  step_request.tenant = tenant_;
  step_request.num_matrices = n;
  step_request.all_or_nothing = true;
  {
    absl::MutexLock lock(&mu_);
    slots_.resize(static_cast<size_t>(n));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Step> step, OpenStep(services_, std::move(step_request), shared_from_this()));
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    step_ = step;
    cancelled = cancelled_;
  }
  if (cancelled) {  // OnCancel came before the step existed.
    step->Cancel(s_.draining.load());
    return absl::OkStatus();
  }
  for (int i = 0; i < n; ++i) {
    MatrixMemory& memory = memories[static_cast<size_t>(i)];
    const bool data_follows = memory.input == nullptr;
    bool ok;
    if (memory.input != nullptr || memory.result != nullptr) {
      ok = step->AddMatrixInMemory(std::move(parsed[i]), std::move(memory));
    } else {
      const std::string name = parsed[i].plan.name;
      ok = step->AddMatrix(std::move(parsed[i]), name, {});
    }
    if (!ok || (data_follows && !step->AddData(i, request_[i].data))) {
      return absl::OkStatus();  // The step failed; it ends the call.
    }
  }
  // The step has copied the bytes: free them.
  request_.clear();
  request_bytes_.Clear();
  step->End();
  return absl::OkStatus();
}

void UnaryCall::Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
                       absl::string_view data, std::shared_ptr<const void> owner) {
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[static_cast<size_t>(index)];
  slot.status = status;
  slot.plan = plan;
  slot.block = block;
  slot.data = data;
  slot.owner = std::move(owner);
}

void UnaryCall::Finished(StepEnd end) {
  if (!end.status.ok()) {
    End(std::move(end.status));
    return;
  }
  std::vector<Slot> slots;
  {
    absl::MutexLock lock(&mu_);
    slots.swap(slots_);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].status.ok()) {
      End(std::move(slots[i].status));
      return;
    }
  }
  // The response refers to the result buffers: no copy of the results.
  std::vector<UnaryResult> results;
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = slots[i];
    UnaryResult r;
    r.header.set_index(static_cast<int>(i));
    r.header.set_name(slot.plan.name);
    r.header.set_dtype(DTypeToProto(slot.plan.result_dtype));
    for (int64_t d : slot.plan.shape) r.header.add_shape(d);
    r.header.set_nd_layout(NdLayoutToProto(slot.plan.layout));
    if (slot.plan.options.normalization == Normalization::kBf16) r.header.set_normalization(v1::NORMALIZATION_BF16);
    *r.header.mutable_block() = BlockToProto(slot.block);
    if (i < result_regions_.size() && result_regions_[i].size() > 0) {
      // The result is in the client's region already: the response says where, and holds no copy.
      *r.header.mutable_result_region() = result_regions_[i];
    } else {
      r.data = slot.data;
      r.owner = std::move(slot.owner);
    }
    results.push_back(std::move(r));
  }
  response_bytes_ = UnaryResponse(std::move(results));
  s_.metrics->BytesOut(kMethod, static_cast<double>(response_bytes_.Length()));
  s_.metrics->TenantBytes(tenant_, "out", static_cast<double>(response_bytes_.Length()));
  End(absl::OkStatus());
}

void UnaryCall::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
  }
  status_ = status;
  if (status.ok()) {
    StartWriteAndFinish(&response_bytes_, grpc::WriteOptions(), grpc::Status::OK);
  } else {
    // As on a stream: the fleet-change mark leaves the process as trailing metadata.
    if (IsFleetChange(status)) context_->AddTrailingMetadata(kRetryableKey, kRetryableFleetChange);
    if (const auto delay = RetryAfter(status)) {
      context_->AddTrailingMetadata(kRetryAfterKey, std::to_string(absl::ToInt64Milliseconds(*delay)));
    }
    Finish(ToGrpcStatus(status));
  }
}

void UnaryCall::OnCancel() {
  std::shared_ptr<Step> step;
  uint64_t wait = 0;
  uint64_t slot_wait = 0;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    step = step_;
    wait = wait_id_;
    slot_wait = slot_wait_id_;
  }
  if (step != nullptr) {
    step->Cancel(s_.draining.load());
  } else if (slot_wait != 0 && s_.unary_gate.CancelWait(slot_wait)) {
    End(absl::CancelledError("the client cancelled the call while it waited for a slot"));
  } else if (wait != 0 && s_.admission.CancelWait(wait)) {
    End(absl::CancelledError("the client cancelled the call while it waited for room"));
  }
  // Otherwise the call is ending already, or is being read (OnReadDone fails), or Run cancels
  // the step it opens.
}

void UnaryCall::OnDone() {
  s_.watchdog.Unregister(watch_id_);
  s_.metrics->inflight_requests().Set(--s_.inflight);
  s_.metrics->RequestDone(kMethod, CodeName(status_.code()), absl::Now() - start_);
  bytes_.Release();
  slot_.Release();
  std::shared_ptr<UnaryCall> self;
  {
    absl::MutexLock lock(&mu_);
    step_.reset();
    self = std::move(self_);
  }
}

}  // namespace orthoserve
