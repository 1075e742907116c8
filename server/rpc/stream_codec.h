// OrthogonalizeStream's messages as raw gRPC byte buffers, so that matrix bytes are not copied
// on their way through the server (docs/architecture.md): a request's DataChunk bytes are read where gRPC
// received them, and a result's DataChunk refers to the result buffer instead of holding a copy.
// The wire format is orthoserve.v1's StreamRequest / StreamResponse, unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "proto/convert/raw_message.h"
#include "server/plan/matrix_plan.h"
#include "server/rpc/spec_codec.h"
#include "server/rpc/service_state.h"
#include "server/step/step.h"

namespace orthoserve {

// One StreamRequest as received (proto/convert/raw_message.h).
using StreamRequestView = RawMessageView<v1::StreamRequest>;

// Parses view->raw into view->message and view->chunk_data. A StreamRequest that holds only a
// DataChunk has its bytes viewed where they lie (no copy); any other message is parsed by
// protobuf. INVALID_ARGUMENT when the bytes are not a StreamRequest.
absl::Status ParseStreamRequest(StreamRequestView* view);

// A StreamResponse holding DataChunk{index, data}, byte for byte what protobuf serializes, whose
// data bytes are not copied: the message refers to them, and holds `owner` (which must keep them
// alive and unchanged) until gRPC has sent them.
grpc::ByteBuffer ChunkResponse(int index, absl::string_view data, std::shared_ptr<const void> owner);

// Result chunks fit gRPC's default 4 MiB receive limit unless the client asks for more: 4 MiB
// less room for the message's framing (DataChunk's tags and lengths take under 30 bytes).
inline constexpr int64_t kDefaultResultChunkBytes = (int64_t{4} << 20) - 1024;

// The result chunk size of a step whose header asked for `requested` bytes (0: the default) on
// a server accepting chunks of up to `limit` bytes.
inline int64_t ResultChunkBytes(int64_t requested, int64_t limit) {
  return std::min(requested > 0 ? requested : kDefaultResultChunkBytes, limit);
}

// Checks the header's sizes against the metadata limits of `options`, in this order:
// INVALID_ARGUMENT naming the field, its size and the flag for world over max_group_world,
// num_matrices over max_matrices_per_step, then job, group and run_id longer than max_name_bytes
// (their text bounded, common/message_text.h).
absl::Status CheckHeaderLimits(const v1::StepHeader& header, const ServiceOptions& options);

// The step of a StepHeader sent by `tenant`, validated against `options`: CheckHeaderLimits
// first, then INVALID_ARGUMENT naming the field for world (>= 1), rank, step, num_matrices (>= 1),
// job (required for world > 1), run_id (required for world > 1 unless
// allow_group_steps_without_run_id), attempt and result_chunk_bytes.
absl::StatusOr<StepRequest> StepRequestFromHeader(const v1::StepHeader& header, std::string tenant,
                                                  const ServiceOptions& options);

// The bounds of `options` that every spec from a client is checked against.
inline SpecLimits SpecLimitsOf(const ServiceOptions& options) {
  return SpecLimits{options.max_matrix_elements, options.max_name_bytes, options.max_shape_dims};
}

// The bytes admission counts for holding `spec`'s metadata (the stream and unary paths add them
// to what the call holds, Admission::AddBytes): its name, 8 per dim of its shape, 24 per custom
// coefficient triple, 8 per split_qkv entry, and kMatrixOverheadBytes for the server's own
// structures of one matrix. Reads only sizes; call it after CheckSpecLimits, which bounds them.
int64_t SpecMetadataBytes(const v1::MatrixSpec& spec);

// Matrix `index`'s result as StreamResponses: its MatrixResult and, when `status` is OK, `data`
// in DataChunks of at most `chunk_bytes` that refer to it (`owner` keeps it alive). With
// `result_region` (not null) the data is in the client's shared-memory region already: the
// MatrixResult names the slice, and no chunk follows.
std::vector<grpc::ByteBuffer> ResultResponses(int index, const MatrixPlan& plan, const Block& block,
                                              const absl::Status& status, absl::string_view data,
                                              const std::shared_ptr<const void>& owner, int64_t chunk_bytes,
                                              const v1::RegionSlice* result_region = nullptr);

// An Orthogonalize result: its MatrixResult without data, and the data bytes, which `owner`
// keeps alive and unchanged.
struct UnaryResult {
  v1::MatrixResult header;
  absl::string_view data;
  std::shared_ptr<const void> owner;
};

// An OrthogonalizeResponse holding `results` in order, byte for byte what protobuf would
// serialize (with each data field last), whose data bytes are not copied: the message refers to
// them and holds their owners until gRPC has sent them.
grpc::ByteBuffer UnaryResponse(std::vector<UnaryResult> results);

// The StepSummary response.
grpc::ByteBuffer SummaryResponse(int matrices_ok, int matrices_failed, int fleet_rank, absl::Duration server_time);

}  // namespace orthoserve
