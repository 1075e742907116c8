// OrthogonalizeStream's messages as raw gRPC byte buffers, so that matrix bytes are not copied
// on their way through the server (DESIGN §9): a request's DataChunk bytes are read where gRPC
// received them, and a result's DataChunk refers to the result buffer instead of holding a copy.
// The wire format is orthoserve.v1's StreamRequest / StreamResponse, unchanged.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "proto/convert/raw_message.h"

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


}  // namespace orthoserve
