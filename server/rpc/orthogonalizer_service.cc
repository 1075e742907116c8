// Unary Orthogonalize and GetServerInfo of server/rpc/orthogonalizer_service.h. The streaming
// call lives in stream_step.cc.
#include "server/rpc/orthogonalizer_service.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/support/method_handler.h"
#include "proto/convert/grpc_status.h"
#include "proto/convert/ns_options_proto.h"
#include "server/fleet/spec_codec.h"
#include "server/rpc/local_batch.h"

namespace orthoserve {
namespace {

// OrthogonalizeStream's position among the service's methods in orthogonalizer.proto.
constexpr int kStreamMethodIndex = 1;

BufferPool::Options CappedBufferOptions(const ServiceOptions& options) {
  BufferPool::Options o = options.buffers;
  o.max_idle_bytes = std::min(o.max_idle_bytes, options.admission.max_inflight_bytes);
  return o;
}

}  // namespace

OrthogonalizerService::OrthogonalizerService(const ServiceOptions& options, Backend* backend, Fleet* fleet,
                                             Metrics* metrics, const TokenAuth* auth, FairPool* compute)
    : options_(options),
      backend_(backend),
      fleet_(fleet),
      metrics_(metrics),
      auth_(auth),
      compute_(compute),
      admission_(options.admission, metrics),
      buffers_(BufferPool::Create(CappedBufferOptions(options))) {
  // The stream's messages are read and written as raw bytes (server/rpc/stream_codec.h), so that
  // matrix data is neither copied into nor out of protobuf messages. This is what the generated
  // code does for its own handler, with ByteBuffer in place of the message types.
  using RawHandler = grpc::internal::BidiStreamingHandler<OrthogonalizerService, grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodStreamed(kStreamMethodIndex, new RawHandler(&OrthogonalizerService::OrthogonalizeRawStream, this));
}

namespace {

// Counts an RPC in flight for its lifetime.
class InflightGuard {
 public:
  InflightGuard(std::atomic<int>& counter, Metrics* metrics) : counter_(counter), metrics_(metrics) {
    metrics_->inflight_requests().Set(++counter_);
  }
  ~InflightGuard() { metrics_->inflight_requests().Set(--counter_); }

 private:
  std::atomic<int>& counter_;
  Metrics* metrics_;
};

}  // namespace

grpc::Status OrthogonalizerService::Orthogonalize(grpc::ServerContext* context, const v1::OrthogonalizeRequest* request,
                                                  v1::OrthogonalizeResponse* response) {
  const absl::Time start = absl::Now();
  InflightGuard guard(inflight_, metrics_);
  absl::Status status = RunUnary(context, *request, *response);
  if (!status.ok()) response->Clear();
  metrics_->RequestDone("Orthogonalize", CodeName(status.code()), absl::Now() - start);
  return ToGrpcStatus(status);
}

absl::Status OrthogonalizerService::RunUnary(grpc::ServerContext* context, const v1::OrthogonalizeRequest& request,
                                             v1::OrthogonalizeResponse& response) {
  if (draining_.load()) return absl::UnavailableError("the server is draining; retry on another rank");
  ASSIGN_OR_RETURN(const std::string tenant, auth_->Authenticate(*context));
  const int n = request.matrices_size();
  if (n == 0) return absl::InvalidArgumentError("the request holds no matrices");
  if (n > options_.max_matrices_per_step) {
    return absl::InvalidArgumentError(absl::StrCat("the request holds ", n, " matrices; at most ",
                                                   options_.max_matrices_per_step, " are accepted per call"));
  }
  // Validate everything (sizes before any allocation), then admit the bytes, then compute.
  std::vector<ParsedSpec> parsed;
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    const v1::Matrix& m = request.matrices(i);
    ASSIGN_OR_RETURN(ParsedSpec p, ParseMatrixSpec(m.spec(), i, options_.max_matrix_elements, /*whole_if_unset=*/true));
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
    int64_t bad = FindNonFinite(p.plan.dtype, m.data().data(), static_cast<size_t>(p.plan.view.numel()));
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " data holds a non-finite value (NaN or Inf) at element ",
                                                     bad, " (row ", bad / p.plan.view.cols, ", col ",
                                                     bad % p.plan.view.cols, ")"));
    }
    bytes += p.plan.view.numel() * static_cast<int64_t>(ElementSize(p.plan.result_dtype));
    parsed.push_back(std::move(p));
  }
  Admission::Ticket ticket;
  RETURN_IF_ERROR(admission_.AddBytes(ticket, tenant, bytes, "this request"));
  metrics_->BytesIn("Orthogonalize", static_cast<double>(request.ByteSizeLong()));
  metrics_->TenantBytes(tenant, "in", static_cast<double>(request.ByteSizeLong()));

  std::vector<std::string> outputs(n);
  std::vector<LocalMatrix> matrices;
  for (int i = 0; i < n; ++i) {
    ParsedSpec& p = parsed[i];
    outputs[i].resize(static_cast<size_t>(p.plan.view.numel()) * ElementSize(p.plan.result_dtype));
    matrices.push_back(LocalMatrix{p.plan, p.block, request.matrices(i).data().data(), outputs[i].data()});
  }
  // One compute job per matrix, in the compute queue's fair order among every call's matrices
  // (a call is one job of its tenant); the call waits for all of them.
  const absl::Time queued = absl::Now();
  const std::string job = absl::StrCat("unary ", reinterpret_cast<uintptr_t>(&response));
  std::vector<absl::StatusOr<BatchResult>> results(n, absl::UnknownError("not computed"));
  std::mutex mu;
  std::condition_variable cv;
  int left = n;
  for (int i = 0; i < n; ++i) {
    metrics_->queue_depth().Increment();
    compute_->Schedule(tenant, job, EstimatedCost(matrices[i].plan), [&, i] {
      metrics_->queue_depth().Decrement();
      const absl::Duration wait = absl::Now() - queued;
      metrics_->StageTime(Stage::kQueue, wait);
      metrics_->TenantQueueWait(tenant, wait);
      // A client that is gone (cancelled, or its deadline passed) gets nothing computed.
      results[i] = context->IsCancelled()
                       ? absl::StatusOr<BatchResult>(
                             absl::CancelledError("the client cancelled the call or its deadline passed"))
                       : RunLocalBatch({std::move(matrices[i])}, *backend_);
      std::lock_guard<std::mutex> lock(mu);
      if (--left == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  }

  for (int i = 0; i < n; ++i) {
    const ParsedSpec& p = parsed[i];
    if (!results[i].ok()) return results[i].status();
    metrics_->StageTime(Stage::kCompute, results[i]->compute_time);
    metrics_->TenantCompute(tenant, results[i]->compute_time);
    metrics_->Flops(results[i]->flops);
    const absl::Status& s = results[i]->matrices[0];
    metrics_->MatrixDone("Orthogonalize", AlgorithmName(p.plan.algorithm), DTypeName(p.plan.dtype), CodeName(s.code()));
    if (!s.ok()) return s;
    v1::MatrixResult* r = response.add_results();
    r->set_index(i);
    r->set_name(p.plan.name);
    r->set_dtype(DTypeToProto(p.plan.result_dtype));
    for (int64_t d : p.plan.shape) r->add_shape(d);
    r->set_nd_layout(NdLayoutToProto(p.plan.layout));
    *r->mutable_block() = BlockToProto(p.block);
    r->set_data(std::move(outputs[i]));
  }
  metrics_->BytesOut("Orthogonalize", static_cast<double>(response.ByteSizeLong()));
  metrics_->TenantBytes(tenant, "out", static_cast<double>(response.ByteSizeLong()));
  return absl::OkStatus();
}

grpc::Status OrthogonalizerService::GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest*,
                                                  v1::ServerInfo* info) {
  absl::StatusOr<std::string> tenant = auth_->Authenticate(*context);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  BackendInfo backend = backend_->Info();
  info->set_version(options_.version);
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
  v1::Limits* limits = info->mutable_limits();
  limits->set_max_message_bytes(options_.max_message_bytes);
  limits->set_chunk_bytes(options_.chunk_bytes);
  limits->set_max_matrix_elements(options_.max_matrix_elements);
  limits->set_max_inflight_bytes(options_.admission.max_inflight_bytes);
  limits->set_max_tenant_inflight_bytes(options_.admission.max_tenant_inflight_bytes);
  limits->set_max_concurrent_streams(options_.admission.max_concurrent_streams);
  limits->set_max_tenant_concurrent_streams(options_.admission.max_tenant_concurrent_streams);
  limits->set_max_steps(kMaxSteps);
  limits->set_rendezvous_timeout_seconds(absl::ToDoubleSeconds(options_.rendezvous_timeout));
  info->set_auth_required(auth_->required());
  info->set_ready(fleet_->ready() && !draining_.load());
  info->set_fleet_generation(fleet_->generation());
  return grpc::Status::OK;
}

}  // namespace orthoserve
