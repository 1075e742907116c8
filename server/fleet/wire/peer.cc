// Implementation of server/fleet/wire/peer.h.
#include "server/fleet/wire/peer.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
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

absl::StatusOr<fleet::v1::Peer::Stub*> PeerClient::StubFor(const std::string& target, int rank) {
  const std::string key = absl::StrCat(rank, "@", target);
  absl::MutexLock lock(&mu_);
  auto it = stubs_.find(key);
  if (it != stubs_.end()) return it->second.get();
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, MakeFleetChannel(target, tls_, rank));
  std::unique_ptr<fleet::v1::Peer::Stub>& stub = stubs_[key];
  stub = fleet::v1::Peer::NewStub(channel);
  return stub.get();
}

struct PeerClient::Call {
  grpc::ClientContext context;
  fleet::v1::ComputeRequest request;
  fleet::v1::ComputeResponse response;
};

void PeerClient::Compute(const std::string& target, int rank, const PeerMatrix& matrix,
                         std::function<void(absl::StatusOr<PeerResult>)> done) {
  auto call = std::make_shared<Call>();
  call->context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline_));
  call->request.set_tenant(matrix.tenant);
  call->request.set_job(matrix.job);
  *call->request.mutable_plan() = MatrixPlanToProto(matrix.plan);
  call->request.set_data(std::string(matrix.data));
  absl::StatusOr<fleet::v1::Peer::Stub*> stub = StubFor(target, rank);
  if (!stub.ok()) {
    done(stub.status());
    return;
  }
  bool gone;
  {
    absl::MutexLock lock(&flights_->mu);
    gone = flights_->gone.contains(rank);
    if (!gone) flights_->calls[rank].insert(call);
  }
  if (gone) {
    done(absl::UnavailableError(absl::StrCat("fleet rank ", rank, " left the fleet's generation")));
    return;
  }
  (*stub)->async()->Compute(&call->context, &call->request, &call->response,
                        [flights = flights_, rank, call, done = std::move(done)](grpc::Status status) {
                          {
                            absl::MutexLock lock(&flights->mu);
                            auto it = flights->calls.find(rank);
                            if (it != flights->calls.end()) {
                              it->second.erase(call);
                              if (it->second.empty()) flights->calls.erase(it);
                            }
                          }
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

void PeerClient::Generation(const std::vector<Member>& members, bool graceful) {
  std::vector<std::shared_ptr<Call>> cancel;
  {
    Flights& f = *flights_;
    absl::MutexLock lock(&f.mu);
    absl::flat_hash_set<int> in;
    for (const Member& m : members) in.insert(m.rank);
    if (!graceful) {
      // Gone: the previous generation's members, and any rank with calls in flight, that this one
      // leaves out. Marked even with nothing in flight: a forward picked from the old generation
      // (the applier may not have reached this entry yet) fails at once.
      for (int rank : f.members) {
        if (!in.contains(rank)) f.gone.insert(rank);
      }
      for (const auto& [rank, calls] : f.calls) {
        if (in.contains(rank)) continue;
        f.gone.insert(rank);
        LOG_WARNING("fleet") << "fleet rank " << rank << " left the generation: cancelling the " << calls.size()
                             << " lone matrices forwarded to it (they are computed here instead)";
        cancel.insert(cancel.end(), calls.begin(), calls.end());
      }
    }
    absl::erase_if(f.gone, [&](int rank) { return in.contains(rank); });
    f.members = std::move(in);
  }
  // Outside the lock: a cancelled call's completion may run on this thread, and it takes the lock.
  for (const std::shared_ptr<Call>& call : cancel) call->context.TryCancel();
}

size_t PeerClient::in_flight() const {
  absl::MutexLock lock(&flights_->mu);
  size_t n = 0;
  for (const auto& [rank, calls] : flights_->calls) n += calls.size();
  return n;
}

}  // namespace orthoserve
