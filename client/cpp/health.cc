// Implementation of client/cpp/health.h.
#include "client/cpp/health.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/convert/grpc_status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace orthoserve::client {
namespace {

using ::google::protobuf::internal::WireFormatLite;

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";

}  // namespace

absl::string_view ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown:
      return "UNKNOWN";
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

std::string EncodeHealthCheckRequest(absl::string_view service) {
  std::string out;
  if (service.empty()) return out;  // proto3: the default value is not written.
  out.push_back(static_cast<char>(WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)));
  for (uint64_t n = service.size();; n >>= 7) {  // Varint length.
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  out.append(service.data(), service.size());
  return out;
}

absl::StatusOr<ServingStatus> DecodeHealthCheckResponse(absl::string_view bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  uint64_t status = 0;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) break;
    if (tag == WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_VARINT)) {
      if (!in.ReadVarint64(&status)) return absl::InternalError("malformed HealthCheckResponse: truncated status");
    } else if (WireFormatLite::GetTagFieldNumber(tag) == 0 || !WireFormatLite::SkipField(&in, tag)) {
      return absl::InternalError("malformed HealthCheckResponse");
    }
  }
  if (!in.ConsumedEntireMessage() || in.CurrentPosition() != static_cast<int>(bytes.size())) {
    return absl::InternalError("malformed HealthCheckResponse");
  }
  if (status > 3) return ServingStatus::kUnknown;
  return static_cast<ServingStatus>(status);
}

absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                                          absl::string_view service) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  const std::string request_bytes = EncodeHealthCheckRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(context, kCheckMethod, request, &cq);
  call->StartCall();
  int finish_tag = 0;
  call->Finish(&response, &status, &finish_tag);
  void* tag = nullptr;
  bool ok = false;
  const bool got = cq.Next(&tag, &ok);
  cq.Shutdown();
  for (void* t; cq.Next(&t, &ok);) {
  }
  if (!got) return absl::InternalError("health check: completion queue shut down unexpectedly");
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("health check: unreadable response");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return DecodeHealthCheckResponse(bytes);
}

}  // namespace orthoserve::client
