// Implementation of server/rpc/stream_codec.h.
#include "server/rpc/stream_codec.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/slice.h"
#include "proto/convert/chunk_wire.h"
#include "proto/convert/ns_options_proto.h"
#include "proto/convert/raw_message.h"

namespace orthoserve {
namespace {

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

// INVALID_ARGUMENT when header field `field` (job, group, run_id) is longer than the limit.
absl::Status CheckNameLength(absl::string_view field, const std::string& value, int max_name_bytes) {
  if (value.size() <= static_cast<size_t>(max_name_bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("header ", field, " (\"", BoundedText(value), "\") has ", value.size(),
                                                 " bytes; at most ", max_name_bytes,
                                                 " are accepted (--max-name-bytes)"));
}

}  // namespace

absl::Status ParseStreamRequest(StreamRequestView* view) {
  if (!ParseRawMessage(view)) return absl::InvalidArgumentError("a message of the stream is not a StreamRequest");
  return absl::OkStatus();
}

grpc::ByteBuffer ChunkResponse(int index, absl::string_view data, std::shared_ptr<const void> owner) {
  uint8_t prefix[kMaxChunkPrefixBytes];
  const size_t prefix_bytes = WriteChunkPrefix(v1::StreamResponse::kChunkFieldNumber, index, data.size(), prefix);
  if (data.empty()) {
    grpc::Slice slice(prefix, prefix_bytes);
    return grpc::ByteBuffer(&slice, 1);
  }
  const grpc::Slice slices[2] = {grpc::Slice(prefix, prefix_bytes),
                                 grpc::Slice(const_cast<char*>(data.data()), data.size(), ReleaseOwner,
                                             new std::shared_ptr<const void>(std::move(owner)))};
  return grpc::ByteBuffer(slices, 2);
}

absl::Status CheckHeaderLimits(const v1::StepHeader& header, const ServiceOptions& options) {
  if (header.world() > options.max_group_world) {
    return absl::InvalidArgumentError(absl::StrCat("header world = ", header.world(), " is over the limit of ",
                                                   options.max_group_world, " trainer ranks (--max-group-world)"));
  }
  if (header.num_matrices() > options.max_matrices_per_step) {
    return absl::InvalidArgumentError(absl::StrCat("header num_matrices = ", header.num_matrices(),
                                                   " is over the limit of ", options.max_matrices_per_step,
                                                   " (--max-matrices-per-step)"));
  }
  RETURN_IF_ERROR(CheckNameLength("job", header.job(), options.max_name_bytes));
  RETURN_IF_ERROR(CheckNameLength("group", header.group(), options.max_name_bytes));
  RETURN_IF_ERROR(CheckNameLength("run_id", header.run_id(), options.max_name_bytes));
  RETURN_IF_ERROR(CheckNameLength("call_id", header.call_id(), options.max_name_bytes));
  return absl::OkStatus();
}

int64_t SpecMetadataBytes(const v1::MatrixSpec& spec) {
  return static_cast<int64_t>(spec.name().size()) + int64_t{8} * spec.shape_size() +
         int64_t{24} * spec.options().custom_coefficients_size() + int64_t{8} * spec.options().split_qkv_size() +
         kMatrixOverheadBytes;
}

absl::StatusOr<StepRequest> StepRequestFromHeader(const v1::StepHeader& header, std::string tenant,
                                                  const ServiceOptions& options) {
  RETURN_IF_ERROR(CheckHeaderLimits(header, options));
  const int max_matrices = options.max_matrices_per_step;
  StepRequest r;
  r.world = header.world() == 0 ? 1 : header.world();
  if (r.world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("header world = ", header.world(), " is out of range; use 1 to ", options.max_group_world));
  }
  if (header.rank() < 0 || header.rank() >= r.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("header rank = ", header.rank(), " is out of range for world = ", r.world));
  }
  if (header.step() < 0) return absl::InvalidArgumentError(absl::StrCat("header step = ", header.step(), " is negative"));
  if (header.num_matrices() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("header num_matrices = ", header.num_matrices(),
                                                   " is out of range; use 1 to ", max_matrices));
  }
  if (r.world > 1 && header.job().empty()) {
    return absl::InvalidArgumentError("header job is empty; a group step (world > 1) needs a job id to meet its ranks");
  }
  if (r.world > 1 && header.run_id().empty() && !options.allow_group_steps_without_run_id) {
    return absl::InvalidArgumentError(
        "header run_id is empty; a group step (world > 1) needs the id of its run, the same on every trainer rank "
        "of the run and on no other run (the shipped clients derive one: ORTHOSERVE_RUN_ID, TORCHELASTIC_RUN_ID, or "
        "agreed over torch.distributed), so that two runs of one job never share a step");
  }
  if (header.attempt() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("header attempt = ", header.attempt(), " is negative"));
  }
  if (header.result_chunk_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header result_chunk_bytes = ", header.result_chunk_bytes(), " is negative"));
  }
  r.tenant = std::move(tenant);
  r.job = header.job();
  r.group = header.group();
  r.step = header.step();
  r.rank = header.rank();
  r.attempt = header.attempt();
  r.num_matrices = header.num_matrices();
  if (r.world > 1) r.run = header.run_id();
  return r;
}

std::vector<grpc::ByteBuffer> ResultResponses(int index, const MatrixPlan& plan, const Block& block,
                                              const absl::Status& status, absl::string_view data,
                                              const std::shared_ptr<const void>& owner, int64_t chunk_bytes,
                                              const v1::RegionSlice* result_region) {
  std::vector<grpc::ByteBuffer> messages;
  v1::StreamResponse header;
  v1::MatrixResult* r = header.mutable_result();
  r->set_index(index);
  r->set_name(plan.name);
  r->set_dtype(DTypeToProto(plan.result_dtype));
  for (int64_t d : plan.shape) r->add_shape(d);
  r->set_nd_layout(NdLayoutToProto(plan.layout));
  if (plan.options.normalization == Normalization::kBf16) r->set_normalization(v1::NORMALIZATION_BF16);
  *r->mutable_block() = BlockToProto(block);
  r->set_code(static_cast<int>(status.code()));
  r->set_message(std::string(status.message()));
  if (status.ok() && result_region != nullptr) *r->mutable_result_region() = *result_region;
  messages.push_back(SerializeToByteBuffer(header));
  if (!status.ok() || result_region != nullptr) return messages;
  for (size_t offset = 0; offset < data.size(); offset += static_cast<size_t>(chunk_bytes)) {
    const size_t n = std::min(static_cast<size_t>(chunk_bytes), data.size() - offset);
    messages.push_back(ChunkResponse(index, data.substr(offset, n), owner));
  }
  return messages;
}

grpc::ByteBuffer UnaryResponse(std::vector<UnaryResult> results) {
  using google::protobuf::io::CodedOutputStream;
  constexpr uint32_t kResultsTag = (1 << 3) | 2;  // OrthogonalizeResponse.results, length-delimited.
  constexpr uint32_t kDataTag = (8 << 3) | 2;     // MatrixResult.data, length-delimited.
  std::vector<grpc::Slice> slices;
  for (UnaryResult& r : results) {
    const std::string header = r.header.SerializeAsString();
    const uint64_t data_bytes = r.data.size();
    const uint64_t data_field = data_bytes == 0 ? 0 : 1 + CodedOutputStream::VarintSize64(data_bytes) + data_bytes;
    const uint64_t length = header.size() + data_field;
    std::string prefix;
    prefix.resize(1 + CodedOutputStream::VarintSize64(length) + header.size() + 1 +
                  CodedOutputStream::VarintSize64(data_bytes));
    uint8_t* out = reinterpret_cast<uint8_t*>(prefix.data());
    out = CodedOutputStream::WriteVarint32ToArray(kResultsTag, out);
    out = CodedOutputStream::WriteVarint64ToArray(length, out);
    out = std::copy(header.begin(), header.end(), out);
    if (data_bytes > 0) {
      out = CodedOutputStream::WriteVarint32ToArray(kDataTag, out);
      out = CodedOutputStream::WriteVarint64ToArray(data_bytes, out);
    }
    prefix.resize(static_cast<size_t>(out - reinterpret_cast<uint8_t*>(prefix.data())));
    slices.emplace_back(prefix.data(), prefix.size());
    if (data_bytes > 0) {
      slices.emplace_back(const_cast<char*>(r.data.data()), r.data.size(), ReleaseOwner,
                          new std::shared_ptr<const void>(std::move(r.owner)));
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer SummaryResponse(int matrices_ok, int matrices_failed, int fleet_rank, absl::Duration server_time) {
  v1::StreamResponse response;
  v1::StepSummary* s = response.mutable_summary();
  s->set_matrices_ok(matrices_ok);
  s->set_matrices_failed(matrices_failed);
  s->set_fleet_rank(fleet_rank);
  s->set_server_seconds(absl::ToDoubleSeconds(server_time));
  return SerializeToByteBuffer(response);
}

}  // namespace orthoserve
