// Implementation of client/cpp/step_codec.h.
#include "client/cpp/step_codec.h"

#include <cstring>
#include <memory>
#include <string>

#include "proto/convert/chunk_wire.h"
#include "grpcpp/support/slice.h"

namespace orthoserve::client {
namespace {

void ReleaseBuffer(void* buffer) { delete static_cast<std::shared_ptr<PooledBuffer>*>(buffer); }

}  // namespace

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
  if (!ParseRawMessage(view)) {
    return absl::InternalError("server protocol error: a message of the stream is not a StreamResponse");
  }
  return absl::OkStatus();
}

}  // namespace orthoserve::client
