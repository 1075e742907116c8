// Implementation of server/fleet/wire/peer.h.
#include "server/fleet/wire/peer.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/convert/grpc_status.h"
#include "grpcpp/channel.h"
#include "server/fleet/wire/fleet_client.h"
#include "server/fleet/logic/lone_compute.h"
#include "server/fleet/wire/plan_codec.h"

namespace orthoserve {
namespace {

// Forwarded matrices are checked again here: the forwarding rank validated them against its own
// --max-matrix-elements; this bound only keeps a malformed request from allocating without limit.
constexpr int64_t kMaxPeerElements = int64_t{1} << 31;

// What Compute checks before it queues a forwarded matrix: that its plan decodes, that it is not
// over the bound above, and that `data` holds the whole matrix. The rest (options, layout, ...)
// is checked by ExecuteBatch's ValidatePlan and the engine, which fail the matrix in-band.
// Returns the plan and its block (the whole matrix); tenant, job and data are the request's.
absl::StatusOr<PeerMatrix> CheckRequest(const fleet::v1::ComputeRequest& request) {
  PeerMatrix m;
  ASSIGN_OR_RETURN(m.plan, MatrixPlanFromProto(request.plan(), 0));
  if (m.plan.view.numel() > kMaxPeerElements) {
    return absl::ResourceExhaustedError(absl::StrCat("a forwarded matrix (\"", m.plan.name, "\") has ",
                                                     m.plan.view.numel(), " elements; a peer computes at most ",
                                                     kMaxPeerElements));
  }
  m.block = WholeBlock(m.plan.view);
  const int64_t bytes = m.block.numel() * static_cast<int64_t>(ElementSize(m.plan.dtype));
  if (static_cast<int64_t>(request.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a forwarded matrix (\"", m.plan.name, "\") has ",
                                                   request.data().size(), " bytes; its plan needs ", bytes));
  }
  return m;
}

}  // namespace

grpc::ServerUnaryReactor* PeerService::Compute(grpc::CallbackServerContext* context,
                                               const fleet::v1::ComputeRequest* request,
                                               fleet::v1::ComputeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (access_ != nullptr) {
    if (absl::Status allowed = access_->RequireMember(*context, "Peer Compute"); !allowed.ok()) {
      reactor->Finish(ToGrpcStatus(allowed));
      return reactor;
    }
  }
  absl::StatusOr<PeerMatrix> checked = CheckRequest(*request);
  if (!checked.ok()) {
    reactor->Finish(ToGrpcStatus(checked.status()));
    return reactor;
  }
  const double cost = EstimatedCost(checked->plan);  // 0 for options ValidatePlan will reject.
  compute_->Schedule(request->tenant(), request->job(), cost,
                     [this, context, request, response, reactor, spec = *std::move(checked)]() mutable {
                       if (context->IsCancelled()) {
                         reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the forwarding rank gave up"));
                         return;
                       }
                       std::string out(static_cast<size_t>(spec.block.numel()) * ElementSize(spec.plan.result_dtype),
                                       '\0');
                       const LoneComputation c = ComputeLoneMatrix(spec.plan, spec.block, request->data().data(),
                                                                   out.data(), *backend_, metrics_, request->tenant());
                       const absl::Status& status = c.status;
                       response->set_compute_seconds(absl::ToDoubleSeconds(c.compute_time));
                       response->set_flops(c.flops);
                       response->set_code(static_cast<int>(status.code()));
                       response->set_message(std::string(status.message()));
                       if (status.ok()) response->set_data(std::move(out));
                       reactor->Finish(grpc::Status::OK);
                     });
  return reactor;
}

fleet::v1::Peer::Stub& PeerClient::StubFor(const std::string& target, int rank) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<fleet::v1::Peer::Stub>& stub = stubs_[absl::StrCat(rank, "@", target)];
  if (stub == nullptr) stub = fleet::v1::Peer::NewStub(MakeFleetChannel(target, tls_, rank));
  return *stub;
}

void PeerClient::Compute(const std::string& target, int rank, const PeerMatrix& matrix,
                         std::function<void(absl::StatusOr<PeerResult>)> done) {
  struct Call {
    grpc::ClientContext context;
    fleet::v1::ComputeRequest request;
    fleet::v1::ComputeResponse response;
  };
  auto call = std::make_shared<Call>();
  call->context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline_));
  call->request.set_tenant(matrix.tenant);
  call->request.set_job(matrix.job);
  *call->request.mutable_plan() = MatrixPlanToProto(matrix.plan);
  call->request.set_data(std::string(matrix.data));
  StubFor(target, rank).async()->Compute(
      &call->context, &call->request, &call->response, [call, done = std::move(done)](grpc::Status status) {
        if (!status.ok()) {
          done(FromGrpcStatus(status));
          return;
        }
        PeerResult result;
        result.status = StatusFromCode(call->response.code(), call->response.message());
        result.data = std::move(*call->response.mutable_data());
        result.compute_time = absl::Seconds(call->response.compute_seconds());
        result.flops = call->response.flops();
        done(std::move(result));
      });
}

}  // namespace orthoserve
