// proto/convert/chunk_wire.h on known encodings: prefixes are protobuf's bytes, and chunks are read in
// place however the stream is split, while every other message is left to protobuf.
#include "proto/convert/chunk_wire.h"

#include <string>
#include <vector>

#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"

namespace orthoserve {
namespace {

std::string Prefix(int field, int index, size_t n) {
  uint8_t out[kMaxChunkPrefixBytes];
  return std::string(reinterpret_cast<const char*>(out), WriteChunkPrefix(field, index, n, out));
}

TEST(ChunkWireTest, PrefixesAreProtobufsBytes) {
  // field 3 (LEN) = {1: 5, 2 (LEN): 4 bytes}: tag 0x1a, length 8, 0x08 0x05, 0x12 0x04.
  EXPECT_EQ(Prefix(3, 5, 4), std::string("\x1a\x08\x08\x05\x12\x04", 6));
  // proto3 leaves index 0 out; field 2.
  EXPECT_EQ(Prefix(2, 0, 4), std::string("\x12\x06\x12\x04", 4));
  // 300 data bytes: varint 0xac 0x02; index 200: varint 0xc8 0x01; length 1+2+1+2+300 = 306.
  EXPECT_EQ(Prefix(3, 200, 300), std::string("\x1a\xb2\x02\x08\xc8\x01\x12\xac\x02", 9));
  // No data: the data field is left out too.
  EXPECT_EQ(Prefix(3, 1, 0), std::string("\x1a\x02\x08\x01", 4));
  // A negative index is a 10-byte varint, as protobuf writes int32.
  EXPECT_EQ(Prefix(3, -1, 1).size(), 2u + 1 + 10 + 2);
}

struct Read {
  bool in_place;
  int index = -7;
  std::string data;
};

Read ReadFrom(const std::string& bytes, int field, int block) {
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()), block);
  std::vector<absl::string_view> views;
  Read r;
  r.in_place = ReadChunkInPlace(&in, field, &r.index, &views);
  for (absl::string_view v : views) {
    EXPECT_GE(v.data(), bytes.data());  // Views into the stream's own bytes.
    EXPECT_LE(v.data() + v.size(), bytes.data() + bytes.size());
    r.data.append(v.data(), v.size());
  }
  return r;
}

TEST(ChunkWireTest, ChunksAreReadInPlaceFromAnySplit) {
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  const std::string message = Prefix(3, 200, data.size()) + data;
  for (int block : {1, 2, 7, 64, 4096}) {
    Read r = ReadFrom(message, 3, block);
    EXPECT_TRUE(r.in_place) << block;
    EXPECT_EQ(r.index, 200) << block;
    EXPECT_EQ(r.data, data) << block;
  }
  // Field order, unknown fields and a repeated data field, as protobuf reads them.
  const std::string body = std::string(
      "\x12\x03"
      "abc"
      "\x08\x09"
      "\x48\x01"
      "\x12\x02"
      "xy",
      13);
  Read r = ReadFrom("\x1a" + std::string(1, static_cast<char>(body.size())) + body, 3, 3);
  EXPECT_TRUE(r.in_place);
  EXPECT_EQ(r.index, 9);
  EXPECT_EQ(r.data, "xy");
}

TEST(ChunkWireTest, EverythingElseIsLeftToProtobuf) {
  const std::string chunk = Prefix(3, 1, 2) + "ab";
  EXPECT_FALSE(ReadFrom(chunk, 2, 4).in_place);                              // Another field.
  EXPECT_FALSE(ReadFrom(chunk + chunk, 3, 4).in_place);                      // The chunk twice (merged).
  EXPECT_FALSE(ReadFrom(chunk + "\x10\x01", 3, 4).in_place);                 // Another field after it.
  EXPECT_FALSE(ReadFrom(chunk.substr(0, chunk.size() - 1), 3, 4).in_place);  // Truncated.
  EXPECT_FALSE(ReadFrom(std::string("\x1a\x03\x12\x05"
                                    "ab",
                                    6),
                        3, 4)
                   .in_place);  // Data past its chunk.
  EXPECT_FALSE(ReadFrom("", 3, 4).in_place);
}

}  // namespace
}  // namespace orthoserve
