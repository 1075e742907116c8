// Implementation of server/rpc/stream_codec.h.
#include "server/rpc/stream_codec.h"

#include <string>
#include <utility>

#include "common/chunk_wire.h"
#include "grpcpp/support/slice.h"

namespace orthoserve {
namespace {

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

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

}  // namespace orthoserve
