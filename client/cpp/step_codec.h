// The client's side of OrthogonalizeStream on raw gRPC byte buffers (docs/architecture.md), the mirror of
// server/rpc/stream_codec.h: a result chunk's bytes are read where gRPC received them, and a
// request chunk is copied once, into reused memory. The wire format is orthoserve.v1's, unchanged.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/buffer_pool.h"
#include "grpcpp/support/byte_buffer.h"
#include "orthoserve/v1/orthogonalizer.pb.h"
#include "proto/convert/raw_message.h"

namespace orthoserve::client {

// A StreamRequest holding DataChunk{index, data}, byte for byte what protobuf serializes, written
// with one copy of `data` into a buffer from `pool` that the message holds until gRPC has sent it
// (no fresh memory per message). RESOURCE_EXHAUSTED when the pool cannot allocate.
absl::StatusOr<grpc::ByteBuffer> ChunkRequest(int index, absl::string_view data, BufferPool& pool);

// One StreamResponse as received (proto/convert/raw_message.h).
using StreamResponseView = RawMessageView<v1::StreamResponse>;

// Parses view->raw into view->message and view->chunk_data (a lone DataChunk in place, anything
// else by protobuf). INTERNAL ("server protocol error") when the bytes are not a StreamResponse.
absl::Status ParseStreamResponse(StreamResponseView* view);

}  // namespace orthoserve::client
