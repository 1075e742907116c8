// Implementation of server/rpc/stream_codec.h.
#include "server/rpc/stream_codec.h"

#include <string>
#include <utility>

#include "common/chunk_wire.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace orthoserve {
namespace {

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

absl::Status ParseStreamRequest(StreamRequestView* view) {
  view->message.Clear();
  view->chunk_data.clear();
  int index;
  {
    grpc::ProtoBufferReader reader(&view->raw);
    if (reader.status().ok() &&
        ReadChunkInPlace(&reader, v1::StreamRequest::kChunkFieldNumber, &index, &view->chunk_data)) {
      view->message.mutable_chunk()->set_index(index);
      return absl::OkStatus();
    }
  }
  grpc::ProtoBufferReader reader(&view->raw);
  if (!reader.status().ok() || !view->message.ParseFromZeroCopyStream(&reader)) {
    view->message.Clear();
    return absl::InvalidArgumentError("a message of the stream is not a StreamRequest");
  }
  view->chunk_data.clear();
  if (view->message.has_chunk()) view->chunk_data.emplace_back(view->message.chunk().data());
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

grpc::ByteBuffer SerializeResponse(const v1::StreamResponse& response) {
  const std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace orthoserve
