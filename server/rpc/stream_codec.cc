// Implementation of server/rpc/stream_codec.h.
#include "server/rpc/stream_codec.h"

#include <algorithm>
#include <string>
#include <utility>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace orthoserve {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

constexpr uint32_t Tag(int field, WireFormatLite::WireType type) { return WireFormatLite::MakeTag(field, type); }

// Field numbers of the messages read and written here (orthoserve/v1/orthogonalizer.proto).
constexpr uint32_t kRequestChunkTag =
    Tag(v1::StreamRequest::kChunkFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kResponseChunkTag =
    Tag(v1::StreamResponse::kChunkFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kIndexTag = Tag(v1::DataChunk::kIndexFieldNumber, WireFormatLite::WIRETYPE_VARINT);
constexpr uint32_t kDataTag = Tag(v1::DataChunk::kDataFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// Appends views of the next `n` bytes of `in` to `views` and skips them.
bool ReadViews(CodedInputStream& in, uint32_t n, std::vector<absl::string_view>* views) {
  while (n > 0) {
    const void* data;
    int size;
    if (!in.GetDirectBufferPointer(&data, &size)) return false;
    const uint32_t take = std::min(n, static_cast<uint32_t>(size));
    views->emplace_back(static_cast<const char*>(data), take);
    in.Skip(static_cast<int>(take));
    n -= take;
  }
  return true;
}

// Reads a StreamRequest that holds nothing but one DataChunk field: its index (protobuf's int32
// of the varint) and views of its bytes (the last data field, as protobuf keeps). False for any
// other message, which protobuf then parses (merging repeated fields, oneof cases, errors).
bool ReadLoneChunk(grpc::ByteBuffer* raw, int* index, std::vector<absl::string_view>* data) {
  grpc::ProtoBufferReader reader(raw);
  if (!reader.status().ok()) return false;
  CodedInputStream in(&reader);
  uint32_t length;
  if (in.ReadTag() != kRequestChunkTag || !in.ReadVarint32(&length)) return false;
  const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  *index = 0;
  data->clear();
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == kIndexTag) {
      uint64_t value;
      if (!in.ReadVarint64(&value)) return false;
      *index = static_cast<int32_t>(value);
    } else if (tag == kDataTag) {
      uint32_t n;
      data->clear();
      if (!in.ReadVarint32(&n) || !ReadViews(in, n, data)) return false;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  if (!in.ConsumedEntireMessage()) return false;
  in.PopLimit(limit);
  return in.ReadTag() == 0 && in.ConsumedEntireMessage();
}

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

absl::Status ParseStreamRequest(StreamRequestView* view) {
  view->message.Clear();
  view->chunk_data.clear();
  int index;
  if (ReadLoneChunk(&view->raw, &index, &view->chunk_data)) {
    view->message.mutable_chunk()->set_index(index);
    return absl::OkStatus();
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
  const uint32_t n = static_cast<uint32_t>(data.size());
  const size_t index_bytes = index == 0 ? 0 : 1 + WireFormatLite::Int32Size(index);
  const size_t data_bytes = n == 0 ? 0 : 1 + CodedOutputStream::VarintSize32(n) + n;
  uint8_t prefix[32];
  uint8_t* p = CodedOutputStream::WriteVarint32ToArray(kResponseChunkTag, prefix);
  p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(index_bytes + data_bytes), p);
  if (index != 0) p = WireFormatLite::WriteInt32ToArray(v1::DataChunk::kIndexFieldNumber, index, p);
  if (n == 0) {
    grpc::Slice slice(prefix, static_cast<size_t>(p - prefix));
    return grpc::ByteBuffer(&slice, 1);
  }
  p = CodedOutputStream::WriteVarint32ToArray(kDataTag, p);
  p = CodedOutputStream::WriteVarint32ToArray(n, p);
  const grpc::Slice slices[2] = {
      grpc::Slice(prefix, static_cast<size_t>(p - prefix)),
      grpc::Slice(const_cast<char*>(data.data()), n, ReleaseOwner, new std::shared_ptr<const void>(std::move(owner)))};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer SerializeResponse(const v1::StreamResponse& response) {
  const std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace orthoserve
