// OrthogonalizeStream's messages (StreamRequest, StreamResponse) read from and written to raw
// gRPC byte buffers, shared by the server (server/rpc/stream_codec) and the C++ client
// (client/cpp/step_codec): a message that holds only a DataChunk has its bytes viewed where gRPC
// received them instead of being copied into a protobuf string (docs/architecture.md).
#pragma once

#include <vector>

#include "absl/strings/string_view.h"
#include "proto/convert/chunk_wire.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace orthoserve {

// One message as received. `message` holds its kind and fields, except that a DataChunk's bytes
// are in `chunk_data` (views, in order) and not in message.chunk().data(). The views point into
// `raw` or `message`: keep the object in place (do not copy or move it) while using them.
template <typename Message>
struct RawMessageView {
  grpc::ByteBuffer raw;  // The message's bytes as gRPC received them.
  Message message;
  std::vector<absl::string_view> chunk_data;
};

// Parses view->raw into view->message and view->chunk_data: a lone DataChunk in place (no copy),
// anything else by protobuf. False when the bytes are not a `Message`.
template <typename Message>
bool ParseRawMessage(RawMessageView<Message>* view) {
  view->message.Clear();
  view->chunk_data.clear();
  int index = 0;
  {
    grpc::ProtoBufferReader reader(&view->raw);
    if (reader.status().ok() && ReadChunkInPlace(&reader, Message::kChunkFieldNumber, &index, &view->chunk_data)) {
      view->message.mutable_chunk()->set_index(index);
      return true;
    }
  }
  grpc::ProtoBufferReader reader(&view->raw);
  view->chunk_data.clear();
  if (!reader.status().ok() || !view->message.ParseFromZeroCopyStream(&reader)) {
    view->message.Clear();
    return false;
  }
  if (view->message.has_chunk()) view->chunk_data.emplace_back(view->message.chunk().data());
  return true;
}

// `message` serialized into one slice (for the small messages: headers, specs, summaries).
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message);

}  // namespace orthoserve
