// The protobuf wire form of a message whose field `field` holds one orthoserve.v1.DataChunk
// {int32 index = 1; bytes data = 2;} — StreamRequest.chunk and StreamResponse.chunk — read and
// written without copying the data bytes (docs/architecture.md). Protobuf's wire format only (no gRPC, no
// generated code): callers pass the outer field number and the byte stream. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/io/zero_copy_stream.h"

namespace orthoserve {

// Reads a message that holds nothing but field `field` = DataChunk from `in`: the chunk's index
// (protobuf's int32 of the varint) and views of its data bytes where they lie in `in`'s buffers,
// valid while those are. As protobuf: the last data field counts, unknown fields are skipped.
// False for any other message (other fields, the chunk field twice, malformed bytes), which the
// caller then parses with protobuf from the start.
bool ReadChunkInPlace(google::protobuf::io::ZeroCopyInputStream* in, int field, int* index,
                      std::vector<absl::string_view>* data);

inline constexpr size_t kMaxChunkPrefixBytes = 32;

// Writes the bytes of message{field: DataChunk{index, data}} that come before `data_bytes` data
// bytes into `out` (kMaxChunkPrefixBytes long) and returns how many: prefix + data is byte for
// byte protobuf's serialization. `data_bytes` < 2^31.
// One orthoserve.v1.Matrix of a request read in place: its spec's serialized bytes (copied:
// they are small) and views of its data bytes where they lie in the input's buffers.
struct MatrixInPlace {
  std::string spec;
  std::vector<absl::string_view> data;
  int64_t data_bytes = 0;
};

// Reads an OrthogonalizeRequest (repeated Matrix matrices = 1, string call_id = 2; Matrix: spec =
// 1, data = 2) from `in`, the data bytes as views valid while `in`'s buffers are, and its call_id
// into `call_id` (may be null: skipped). As protobuf: several spec fields merge, the last data and
// call_id fields count, unknown fields are skipped. False for malformed bytes and for a call_id that
// is not UTF-8 (protobuf refuses such a string field).
bool ReadMatricesInPlace(google::protobuf::io::ZeroCopyInputStream* in, std::vector<MatrixInPlace>* matrices,
                         std::string* call_id = nullptr);

size_t WriteChunkPrefix(int field, int index, size_t data_bytes, uint8_t* out);

}  // namespace orthoserve
