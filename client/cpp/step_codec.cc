// Implementation of client/cpp/step_codec.h.
#include "client/cpp/step_codec.h"

#include <cstring>
#include <memory>
#include <string>

#include "common/chunk_wire.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace orthoserve::client {
namespace {

void ReleaseBuffer(void* buffer) { delete static_cast<std::shared_ptr<PooledBuffer>*>(buffer); }

}  // namespace

grpc::ByteBuffer SerializeRequest(const v1::StreamRequest& request) {
  grpc::Slice slice(request.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<grpc::ByteBuffer> ChunkRequest(int index, absl::string_view data, BufferPool& pool) {
  uint8_t prefix[kMaxChunkPrefixBytes];
  const size_t prefix_bytes = WriteChunkPrefix(v1::StreamRequest::kChunkFieldNumber, index, data.size(), prefix);
  absl::StatusOr<std::shared_ptr<PooledBuffer>> buffer = pool.Get(prefix_bytes + data.size());
  if (!buffer.ok()) return buffer.status();
  char* out = (*buffer)->data();
  const size_t size = (*buffer)->size();
  std::memcpy(out, prefix, prefix_bytes);
  std::memcpy(out + prefix_bytes, data.data(), data.size());
  grpc::Slice slice(out, size, ReleaseBuffer, new std::shared_ptr<PooledBuffer>(*std::move(buffer)));
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseStreamResponse(StreamResponseView* view) {
  view->message.Clear();
  view->chunk_data.clear();
  int index;
  {
    grpc::ProtoBufferReader reader(&view->raw);
    if (reader.status().ok() &&
        ReadChunkInPlace(&reader, v1::StreamResponse::kChunkFieldNumber, &index, &view->chunk_data)) {
      view->message.mutable_chunk()->set_index(index);
      return absl::OkStatus();
    }
  }
  grpc::ProtoBufferReader reader(&view->raw);
  if (!reader.status().ok() || !view->message.ParseFromZeroCopyStream(&reader)) {
    view->message.Clear();
    return absl::InternalError("server protocol error: a message of the stream is not a StreamResponse");
  }
  view->chunk_data.clear();
  if (view->message.has_chunk()) view->chunk_data.emplace_back(view->message.chunk().data());
  return absl::OkStatus();
}

}  // namespace orthoserve::client
