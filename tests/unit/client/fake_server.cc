// Implementation of tests/unit/client/fake_server.h.
#include "tests/unit/client/fake_server.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/shape.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "proto/convert/ns_options_proto.h"

namespace orthoserve::client::testing {
namespace {

// 2·X of `data` (spec.dtype) in the result dtype. Returns false with `message` for bad specs.
bool Compute(const v1::MatrixSpec& spec, const std::string& data, v1::MatrixResult* result, std::string* out,
             bool echo_nd_layout, bool echo_normalization, const std::string& result_name = "",
             int64_t result_row_shift = 0) {
  result->set_name(spec.name());
  if (echo_nd_layout) result->set_nd_layout(spec.nd_layout());
  if (echo_normalization) result->set_normalization(spec.options().normalization());
  *result->mutable_shape() = spec.shape();
  const v1::DType result_dtype = spec.result_dtype() == v1::DTYPE_UNSPECIFIED ? spec.dtype() : spec.result_dtype();
  result->set_dtype(result_dtype);
  if (absl::StartsWith(spec.name(), "bad")) {
    result->set_code(3);
    result->set_message(absl::StrCat("matrix \"", spec.name(), "\" options: steps = 101 is out of range"));
    return false;
  }
  auto in_dtype = DTypeFromProto(spec.dtype(), "dtype");
  auto out_dtype = DTypeFromProto(result_dtype, "result_dtype");
  const size_t n = data.size() / ElementSize(*in_dtype);
  std::vector<float> values(n);
  ConvertToF32(*in_dtype, data.data(), n, values.data());
  for (float& v : values) v *= 2;
  out->resize(n * ElementSize(*out_dtype));
  ConvertFromF32(*out_dtype, values.data(), n, out->data());
  *result->mutable_block() = spec.block();
  if (!result_name.empty()) result->set_name(result_name);
  if (result_row_shift != 0) result->mutable_block()->set_row_offset(spec.block().row_offset() + result_row_shift);
  return true;
}

size_t BlockBytes(const v1::MatrixSpec& spec) {
  Block block = BlockFromProto(spec.block());
  if (block == Block{}) {
    auto m = ViewAs2d(std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), "shape");
    block = WholeBlock(*m);
  }
  auto dtype = DTypeFromProto(spec.dtype(), "dtype");
  return static_cast<size_t>(block.numel()) * ElementSize(*dtype);
}

}  // namespace

grpc::Status FakeOrthogonalizer::CheckAuth(grpc::ServerContext* context) {
  auto it = context->client_metadata().find("authorization");
  std::string value = it == context->client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
  {
    absl::MutexLock lock(&mu);
    last_authorization = value;
  }
  if (!required_token.empty() && value != "Bearer " + required_token) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token");
  }
  return grpc::Status::OK;
}

grpc::Status FakeOrthogonalizer::TakeFailure(std::atomic<int>& budget, grpc::ServerContext* context) {
  int left = budget.load();
  while (left > 0 && !budget.compare_exchange_weak(left, left - 1)) {
  }
  if (left <= 0) return grpc::Status::OK;
  if (fail_fleet_change) context->AddTrailingMetadata("orthoserve-retryable", "fleet-change");
  return grpc::Status(fail_code, "injected failure");
}

bool FakeOrthogonalizer::Stall(std::atomic<int>& budget, grpc::ServerContext* context) {
  int left = budget.load();
  while (left > 0 && !budget.compare_exchange_weak(left, left - 1)) {
  }
  if (left <= 0) return false;
  ++stalled;
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (!context->IsCancelled() && std::chrono::system_clock::now() < context->deadline() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

grpc::Status FakeOrthogonalizer::GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest*,
                                               v1::ServerInfo* info) {
  ++info_calls;
  grpc::Status auth = CheckAuth(context);
  if (!auth.ok()) return auth;
  if (grpc::Status failure = TakeFailure(fail_info, context); !failure.ok()) return failure;
  if (Stall(stall_info, context)) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "stalled");
  absl::MutexLock lock(&mu);
  info->set_version("fake");
  info->set_backend("cpu");
  info->set_fleet_rank(fleet_rank);
  info->set_fleet_world(members.empty() ? 1 : static_cast<int>(members.size()));
  for (size_t r = 0; r < members.size(); ++r) {
    v1::FleetMember* m = info->add_members();
    m->set_rank(static_cast<int>(r));
    m->set_address(members[r]);
    m->set_ready(member_ready.empty() || member_ready[r]);
  }
  info->set_fleet_generation(fleet_generation);
  info->mutable_limits()->set_chunk_bytes(chunk_bytes);
  info->mutable_limits()->set_max_message_bytes(64 << 20);
  info->set_ready(true);
  return grpc::Status::OK;
}

grpc::Status FakeOrthogonalizer::Orthogonalize(grpc::ServerContext* context, const v1::OrthogonalizeRequest* request,
                                               v1::OrthogonalizeResponse* response) {
  ++unary_calls;
  grpc::Status auth = CheckAuth(context);
  if (!auth.ok()) return auth;
  if (grpc::Status failure = TakeFailure(fail_unary, context); !failure.ok()) return failure;
  if (Stall(stall_unary, context)) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "stalled");
  for (int i = 0; i < request->matrices_size(); ++i) {
    v1::MatrixResult* r = response->add_results();
    r->set_index(i);
    std::string out;
    if (Compute(request->matrices(i).spec(), request->matrices(i).data(), r, &out, echo_nd_layout, echo_normalization,
                result_name,
                result_row_shift)) {
      r->set_data(out);
    }
  }
  return grpc::Status::OK;
}

grpc::Status FakeOrthogonalizer::OrthogonalizeStream(
    grpc::ServerContext* context, grpc::ServerReaderWriter<v1::StreamResponse, v1::StreamRequest>* stream) {
  ++streams;
  grpc::Status auth = CheckAuth(context);
  if (!auth.ok()) return auth;
  const absl::Time start = absl::Now();
  v1::StreamRequest request;
  if (!stream->Read(&request) || !request.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the stream must open with a StepHeader");
  }
  const v1::StepHeader header = request.header();
  {
    absl::MutexLock lock(&mu);
    last_header = header;
    attempts.push_back(header.attempt());
  }
  grpc::Status failure = TakeFailure(fail_streams, context);
  if (!failure.ok() && !fail_after_results) return failure;
  if (Stall(stall_streams, context)) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "stalled");
  if (header.job() == "abort") return grpc::Status(grpc::StatusCode::ABORTED, "step 7 of group abort/x aborted");
  int ok = 0, failed = 0;
  for (int i = 0; i < header.num_matrices(); ++i) {
    if (!stream->Read(&request) || !request.has_spec()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("expected the spec of matrix ", i));
    }
    const v1::MatrixSpec spec = request.spec();
    const size_t bytes = BlockBytes(spec);
    std::string data;
    while (data.size() < bytes) {
      if (!stream->Read(&request) || !request.has_chunk() || request.chunk().index() != i) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("expected data of matrix ", i));
      }
      const int64_t size = static_cast<int64_t>(request.chunk().data().size());
      if (size > chunk_bytes) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("chunk of ", size, " bytes is over ", chunk_bytes));
      }
      int64_t prev = largest_chunk_received.load();
      while (size > prev && !largest_chunk_received.compare_exchange_weak(prev, size)) {
      }
      data += request.chunk().data();
    }
    if (data.size() != bytes) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "too many bytes");
    v1::StreamResponse response;
    v1::MatrixResult* r = response.mutable_result();
    r->set_index(i);
    std::string out;
    const bool computed = Compute(spec, data, r, &out, echo_nd_layout, echo_normalization, result_name, result_row_shift);
    computed ? ++ok : ++failed;
    if (send_extra_byte) out.push_back('x');
    stream->Write(response);
    for (size_t off = 0; off < out.size(); off += chunk_bytes) {
      v1::StreamResponse chunk;
      chunk.mutable_chunk()->set_index(i);
      chunk.mutable_chunk()->set_data(out.substr(off, chunk_bytes));
      stream->Write(chunk);
    }
    std::shared_ptr<absl::Notification> wait_for = gate;
    if (i == 0 && wait_for != nullptr) {
      while (!wait_for->WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
        if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        // The server may notice the deadline before the client does; answer as the client would.
        if (std::chrono::system_clock::now() > context->deadline()) {
          return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
        }
      }
    }
  }
  if (!stream->Read(&request) || !request.has_end()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected StepEnd");
  }
  if (!failure.ok()) return failure;
  v1::StreamResponse summary;
  summary.mutable_summary()->set_matrices_ok(ok);
  summary.mutable_summary()->set_matrices_failed(failed);
  summary.mutable_summary()->set_fleet_rank(fleet_rank);
  summary.mutable_summary()->set_server_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  stream->Write(summary);
  return grpc::Status::OK;
}

void FakeServer::Start(const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(service.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server = builder.BuildAndStart();
  address = absl::StrCat("127.0.0.1:", port);
}

FakeServer::~FakeServer() {
  if (server != nullptr) server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

}  // namespace orthoserve::client::testing
