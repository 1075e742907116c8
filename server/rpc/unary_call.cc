// Implementation of server/rpc/unary_call.h.
#include "server/rpc/unary_call.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/convert/grpc_status.h"
#include "proto/convert/ns_options_proto.h"
#include "server/fleet/spec_codec.h"

namespace orthoserve {
namespace {

constexpr char kMethod[] = "Orthogonalize";

}  // namespace

grpc::ServerUnaryReactor* UnaryCall::Start(ServiceState& state, grpc::CallbackServerContext* context,
                                           const v1::OrthogonalizeRequest* request,
                                           v1::OrthogonalizeResponse* response) {
  std::shared_ptr<UnaryCall> call(new UnaryCall(state, context, request, response));
  call->self_ = call;
  state.metrics->inflight_requests().Set(++state.inflight);
  absl::Status begun = call->Begin();
  if (!begun.ok()) call->End(std::move(begun));
  return call.get();
}

UnaryCall::UnaryCall(ServiceState& state, grpc::CallbackServerContext* context,
                     const v1::OrthogonalizeRequest* request, v1::OrthogonalizeResponse* response)
    : s_(state), context_(context), request_(request), response_(response), services_(state.steps) {
  services_.method = kMethod;
}

absl::Status UnaryCall::Begin() {
  if (s_.draining.load()) return absl::UnavailableError("the server is draining; retry on another rank");
  ASSIGN_OR_RETURN(tenant_, s_.auth->Authenticate(*context_));
  const int n = request_->matrices_size();
  if (n == 0) return absl::InvalidArgumentError("the request holds no matrices");
  if (n > s_.options.max_matrices_per_step) {
    return absl::InvalidArgumentError(absl::StrCat("the request holds ", n, " matrices; at most ",
                                                   s_.options.max_matrices_per_step, " are accepted per call"));
  }
  // Validate everything (sizes before any allocation), then admit the bytes, then compute.
  std::vector<ParsedSpec> parsed;
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    const v1::Matrix& m = request_->matrices(i);
    ASSIGN_OR_RETURN(ParsedSpec p, ParseMatrixSpec(m.spec(), i, s_.options.max_matrix_elements, /*whole_if_unset=*/true));
    const std::string what = absl::StrCat("matrix ", i, " (\"", m.spec().name(), "\")");
    if (!(p.block == WholeBlock(p.plan.view))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " block: a unary call carries whole matrices; send blocks "
                                                           "of a group through OrthogonalizeStream"));
    }
    if (static_cast<int64_t>(m.data().size()) != p.block_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, " data has ", m.data().size(), " bytes; a ", p.plan.view.rows,
                                                     "x", p.plan.view.cols, " ", DTypeName(p.plan.dtype),
                                                     " matrix has ", p.block_bytes));
    }
    const int64_t bad = FindNonFinite(p.plan.dtype, m.data().data(), static_cast<size_t>(p.plan.view.numel()));
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " data holds a non-finite value (NaN or Inf) at element ",
                                                     bad, " (row ", bad / p.plan.view.cols, ", col ",
                                                     bad % p.plan.view.cols, ")"));
    }
    bytes += p.block_bytes + p.plan.view.numel() * static_cast<int64_t>(ElementSize(p.plan.result_dtype));
    parsed.push_back(std::move(p));
  }
  RETURN_IF_ERROR(s_.admission.AddBytes(bytes_, tenant_, bytes, "this request"));
  s_.metrics->BytesIn(kMethod, static_cast<double>(request_->ByteSizeLong()));
  s_.metrics->TenantBytes(tenant_, "in", static_cast<double>(request_->ByteSizeLong()));

  StepRequest step_request;
  step_request.tenant = tenant_;
  step_request.num_matrices = n;
  slots_.resize(static_cast<size_t>(n));
  ASSIGN_OR_RETURN(std::shared_ptr<Step> step, OpenStep(services_, std::move(step_request), shared_from_this()));
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = step;
    cancelled = cancelled_;
  }
  if (cancelled) {  // OnCancel came before the step existed.
    step->Cancel(s_.draining.load());
    return absl::OkStatus();
  }
  for (int i = 0; i < n; ++i) {
    const v1::Matrix& m = request_->matrices(i);
    const absl::string_view data = m.data();
    if (!step->AddMatrix(std::move(parsed[i]), m.spec().name(), {}) || !step->AddData(i, {&data, 1})) {
      return absl::OkStatus();  // The step failed; it ends the call.
    }
  }
  step->End();
  return absl::OkStatus();
}

void UnaryCall::Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
                       absl::string_view data, std::shared_ptr<const void>) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[static_cast<size_t>(index)];
  slot.status = status;
  slot.plan = plan;
  slot.block = block;
  slot.data.assign(data.data(), data.size());
}

void UnaryCall::Finished(StepEnd end) {
  if (!end.status.ok()) {
    End(std::move(end.status));
    return;
  }
  std::vector<Slot> slots;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots.swap(slots_);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].status.ok()) {
      End(std::move(slots[i].status));
      return;
    }
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = slots[i];
    v1::MatrixResult* r = response_->add_results();
    r->set_index(static_cast<int>(i));
    r->set_name(slot.plan.name);
    r->set_dtype(DTypeToProto(slot.plan.result_dtype));
    for (int64_t d : slot.plan.shape) r->add_shape(d);
    r->set_nd_layout(NdLayoutToProto(slot.plan.layout));
    *r->mutable_block() = BlockToProto(slot.block);
    r->set_data(std::move(slot.data));
  }
  s_.metrics->BytesOut(kMethod, static_cast<double>(response_->ByteSizeLong()));
  s_.metrics->TenantBytes(tenant_, "out", static_cast<double>(response_->ByteSizeLong()));
  End(absl::OkStatus());
}

void UnaryCall::End(absl::Status status) {
  if (!status.ok()) response_->Clear();
  status_ = status;
  Finish(ToGrpcStatus(status));
}

void UnaryCall::OnCancel() {
  std::shared_ptr<Step> step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    step = step_;
  }
  // Without a step the call is ending already (Begin failed), or Begin cancels the step it opens.
  if (step != nullptr) step->Cancel(s_.draining.load());
}

void UnaryCall::OnDone() {
  s_.metrics->inflight_requests().Set(--s_.inflight);
  s_.metrics->RequestDone(kMethod, CodeName(status_.code()), absl::Now() - start_);
  bytes_.Release();
  std::shared_ptr<UnaryCall> self;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_.reset();
    self = std::move(self_);
  }
}

}  // namespace orthoserve
