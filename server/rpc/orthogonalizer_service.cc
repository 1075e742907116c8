// OrthogonalizerService of server/rpc/orthogonalizer_service.h: the calls are in
// stream_call.cc and unary_call.cc; GetServerInfo is here.
#include "server/rpc/orthogonalizer_service.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/convert/grpc_status.h"
#include "proto/convert/ns_options_proto.h"
#include "server/rpc/stream_call.h"
#include "server/rpc/unary_call.h"

namespace orthoserve {
namespace {

BufferPool::Options CappedBufferOptions(const ServiceOptions& options) {
  BufferPool::Options o = options.buffers;
  o.max_idle_bytes = std::min(o.max_idle_bytes, options.admission.max_inflight_bytes);
  return o;
}

}  // namespace

OrthogonalizerService::OrthogonalizerService(const ServiceOptions& options, Backend* backend, Fleet* fleet,
                                             Metrics* metrics, const TokenAuth* auth, FairPool* compute,
                                             RegionRegistry* regions)
    : backend_(backend), fleet_(fleet) {
  std::shared_ptr<BufferPool> buffers = BufferPool::Create(CappedBufferOptions(options));
  StepServices steps;
  steps.fleet = fleet;
  steps.compute = compute;
  steps.backend = backend;
  steps.buffers = buffers.get();
  steps.metrics = metrics;
  state_ = std::make_unique<ServiceState>(options, steps, auth, std::move(buffers));
  state_->regions = regions;
}

grpc::ServerGenericBidiReactor* OrthogonalizerService::Generic::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  if (context->method() == kOrthogonalizeMethod) return UnaryCall::Start(*service_.state_, context);
  return grpc::CallbackGenericService::CreateReactor(context);  // UNIMPLEMENTED.
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OrthogonalizerService::OrthogonalizeStream(
    grpc::CallbackServerContext* context) {
  return StreamCall::Start(*state_, context);
}

grpc::Status OrthogonalizerService::GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest*,
                                                  v1::ServerInfo* info) {
  absl::StatusOr<std::string> tenant = state_->auth->Authenticate(*context);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  BackendInfo backend = backend_->Info();
  info->set_version(state_->options.version);
  info->set_backend(backend.name);
  info->set_device(backend.device);
  info->set_fleet_rank(fleet_->rank());
  info->set_fleet_world(fleet_->world());
  for (const FleetMemberInfo& m : fleet_->members()) {
    v1::FleetMember* member = info->add_members();
    member->set_rank(m.rank);
    member->set_address(m.address);
    member->set_ready(m.ready);
  }
  const FleetCoordinatorInfo coordinator = fleet_->coordinator_info();
  v1::FleetCoordinator* c = info->mutable_coordinator();
  c->set_membership(coordinator.elected ? "etcd" : "static");
  c->set_rank(coordinator.rank);
  c->set_term(coordinator.term);
  c->set_etcd_reachable(coordinator.etcd_reachable);
  if (!coordinator.etcd_reachable) {
    c->set_etcd_unreachable_seconds(absl::ToDoubleSeconds(absl::Now() - coordinator.etcd_unreachable_since));
    c->set_etcd_error(coordinator.etcd_error);
  }
  for (const char* d : {"fp32", "bf16", "fp16"}) info->add_dtypes(d);
  for (auto t : {CoefficientType::kSimple, CoefficientType::kQuintic, CoefficientType::kPolarExpress,
                 CoefficientType::kAol, CoefficientType::kCans, CoefficientType::kDeepseekV4, CoefficientType::kCubic5,
                 CoefficientType::kCustom}) {
    info->add_coefficients(std::string(CoefficientTypeName(t)));
  }
  for (auto p : {Precision::kHighest, Precision::kHigh, Precision::kMedium}) {
    info->add_precisions(std::string(PrecisionName(p)));
  }
  for (auto s : {ScaleMode::kSpectral, ScaleMode::kShapeScaling, ScaleMode::kUnitRmsNorm, ScaleMode::kNone}) {
    info->add_scale_modes(std::string(ScaleModeName(s)));
  }
  for (auto a : {Algorithm::kAuto, Algorithm::kRowSharded, Algorithm::kGathered, Algorithm::kTpDuplicated,
                 Algorithm::kTpDistributed, Algorithm::kTpBlockwise}) {
    info->add_algorithms(std::string(AlgorithmName(a)));
  }
  for (NdLayout layout : {NdLayout::kFlatten, NdLayout::kBatch}) {
    info->add_nd_layouts(std::string(NdLayoutName(layout)));
  }
  for (Normalization n : {Normalization::kFp32, Normalization::kBf16}) {
    info->add_normalizations(std::string(NormalizationName(n)));
  }
  v1::Limits* limits = info->mutable_limits();
  limits->set_max_message_bytes(state_->options.max_message_bytes);
  limits->set_chunk_bytes(state_->options.chunk_bytes);
  limits->set_max_matrix_elements(state_->options.max_matrix_elements);
  limits->set_max_inflight_bytes(state_->options.admission.max_inflight_bytes);
  limits->set_max_tenant_inflight_bytes(state_->options.admission.max_tenant_inflight_bytes);
  limits->set_max_concurrent_streams(state_->options.admission.max_concurrent_streams);
  limits->set_max_tenant_concurrent_streams(state_->options.admission.max_tenant_concurrent_streams);
  limits->set_max_tenant_calls_per_second(state_->options.admission.max_tenant_calls_per_second);
  limits->set_stream_progress_timeout_seconds(
      std::max(0.0, absl::ToDoubleSeconds(state_->options.stream_progress_timeout)));
  limits->set_max_steps(kMaxSteps);
  limits->set_max_name_bytes(state_->options.max_name_bytes);
  limits->set_max_shape_dims(state_->options.max_shape_dims);
  limits->set_max_matrices_per_step(state_->options.max_matrices_per_step);
  limits->set_max_group_world(state_->options.max_group_world);
  limits->set_max_tenant_pending_steps(state_->options.max_tenant_pending_steps);
  limits->set_rendezvous_timeout_seconds(absl::ToDoubleSeconds(state_->options.rendezvous_timeout));
  info->set_auth_required(state_->auth->required());
  info->set_ready(fleet_->ready() && !state_->draining.load());
  info->set_fleet_generation(fleet_->generation());
  info->set_shm_socket(state_->options.shm_socket);
  info->set_shm_cuda_device(state_->options.shm_cuda_device);
  return grpc::Status::OK;
}

}  // namespace orthoserve
