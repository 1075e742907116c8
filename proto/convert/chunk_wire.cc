// Implementation of proto/convert/chunk_wire.h.
#include "proto/convert/chunk_wire.h"

#include <algorithm>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

#include "google/protobuf/stubs/common.h"
#include "orthoserve/v1/orthogonalizer.pb.h"

namespace orthoserve {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

// orthoserve.v1.DataChunk's fields (orthoserve/v1/orthogonalizer.proto).
constexpr int kIndexField = 1;
constexpr int kDataField = 2;

constexpr uint32_t LengthDelimitedTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}
constexpr uint32_t kIndexTag = WireFormatLite::MakeTag(kIndexField, WireFormatLite::WIRETYPE_VARINT);
constexpr uint32_t kDataTag = LengthDelimitedTag(kDataField);

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

// The next field's tag as protobuf's parser takes one: false for a tag written in more than 5
// bytes, which CodedInputStream::ReadTag accepts (its varint reader allows 10) and protobuf's
// parser refuses; 0 at the end of the input or of the current limit.
bool NextTag(CodedInputStream& in, uint32_t* tag) {
  const int before = in.CurrentPosition();
  *tag = in.ReadTag();
  return in.CurrentPosition() - before <= 5;
}

}  // namespace

bool ReadChunkInPlace(google::protobuf::io::ZeroCopyInputStream* stream, int field, int* index,
                      std::vector<absl::string_view>* data) {
  CodedInputStream in(stream);
  uint32_t tag, length;
  if (!NextTag(in, &tag) || tag != LengthDelimitedTag(field) || !in.ReadVarint32(&length)) return false;
  const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  *index = 0;
  data->clear();
  while (true) {
    if (!NextTag(in, &tag)) return false;
    if (tag == 0) break;
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
  // The end of the input ends the loop too: the chunk ended only if that was its length's end.
  if (!in.ConsumedEntireMessage() || in.BytesUntilLimit() != 0) return false;
  in.PopLimit(limit);
  return NextTag(in, &tag) && tag == 0 && in.ConsumedEntireMessage();
}

bool ReadMatricesInPlace(google::protobuf::io::ZeroCopyInputStream* stream, std::vector<MatrixInPlace>* matrices,
                         std::string* call_id) {
  // orthoserve.v1.OrthogonalizeRequest's matrices and call_id, and orthoserve.v1.Matrix's fields.
  constexpr uint32_t kMatrixTag = LengthDelimitedTag(1);
  constexpr uint32_t kCallIdTag = LengthDelimitedTag(2);
  constexpr uint32_t kSpecTag = LengthDelimitedTag(1);
  constexpr uint32_t kMatrixDataTag = LengthDelimitedTag(2);
  CodedInputStream in(stream);
  matrices->clear();
  if (call_id != nullptr) call_id->clear();
  uint32_t tag;
  while (true) {
    if (!NextTag(in, &tag)) return false;
    if (tag == 0) break;
    if (tag == kCallIdTag) {
      uint32_t n;
      std::string id;
      if (!in.ReadVarint32(&n) || !in.ReadString(&id, static_cast<int>(n))) return false;
      // A string field: protobuf refuses one that is not UTF-8.
      if (!google::protobuf::internal::IsStructurallyValidUTF8(id.data(), static_cast<int>(id.size()))) return false;
      if (call_id != nullptr) *call_id = std::move(id);
      continue;
    }
    if (tag != kMatrixTag) {
      if (!WireFormatLite::SkipField(&in, tag)) return false;
      continue;
    }
    uint32_t length;
    if (!in.ReadVarint32(&length)) return false;
    const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
    MatrixInPlace& m = matrices->emplace_back();
    int spec_pieces = 0;
    uint32_t field;
    while (true) {
      if (!NextTag(in, &field)) return false;
      if (field == 0) break;
      uint32_t n;
      if (field == kSpecTag) {
        // Several spec fields merge, as protobuf merges them: their bytes joined parse as the
        // merge of each parsed alone — when each parses alone, which protobuf requires and the
        // joined bytes would hide (a field cut at one's end and ended by the next). The caller
        // parses the joined bytes; a second piece makes each be parsed alone here first.
        std::string piece;
        if (!in.ReadVarint32(&n) || !in.ReadString(&piece, static_cast<int>(n))) return false;
        if (++spec_pieces > 1) {
          v1::MatrixSpec alone;
          if (spec_pieces == 2 && !alone.ParseFromString(m.spec)) return false;
          if (!alone.ParseFromString(piece)) return false;
        }
        m.spec += piece;
      } else if (field == kMatrixDataTag) {
        m.data.clear();
        if (!in.ReadVarint32(&n) || !ReadViews(in, n, &m.data)) return false;
        m.data_bytes = n;
      } else if (!WireFormatLite::SkipField(&in, field)) {
        return false;
      }
    }
    // The end of the input ends the loop too: the matrix ended only if that was its length's end.
    if (!in.ConsumedEntireMessage() || in.BytesUntilLimit() != 0) return false;
    in.PopLimit(limit);
  }
  return in.ConsumedEntireMessage();
}

size_t WriteChunkPrefix(int field, int index, size_t data_bytes, uint8_t* out) {
  const uint32_t n = static_cast<uint32_t>(data_bytes);
  const size_t index_bytes = index == 0 ? 0 : 1 + WireFormatLite::Int32Size(index);
  const size_t data_field_bytes = n == 0 ? 0 : 1 + CodedOutputStream::VarintSize32(n) + n;
  uint8_t* p = CodedOutputStream::WriteVarint32ToArray(LengthDelimitedTag(field), out);
  p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(index_bytes + data_field_bytes), p);
  if (index != 0) p = WireFormatLite::WriteInt32ToArray(kIndexField, index, p);
  if (n != 0) {
    p = CodedOutputStream::WriteVarint32ToArray(kDataTag, p);
    p = CodedOutputStream::WriteVarint32ToArray(n, p);
  }
  return static_cast<size_t>(p - out);
}

}  // namespace orthoserve
