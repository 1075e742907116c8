// server/rpc/stream_codec.h against protobuf itself: result chunks are byte for byte what
// protobuf serializes, and requests read in place mean what protobuf parses, however gRPC split
// them into slices.
#include "server/rpc/stream_codec.h"

#include <climits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;

using ::testing::HasSubstr;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a byte buffer of slices of `slice` bytes (the way gRPC may hand a message over).
grpc::ByteBuffer Split(const std::string& bytes, size_t slice) {
  std::vector<grpc::Slice> slices;
  for (size_t offset = 0; offset < bytes.size(); offset += slice) {
    slices.emplace_back(bytes.data() + offset, std::min(slice, bytes.size() - offset));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Data(size_t n) {
  std::string data(n, '\0');
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * 7 + 1);
  return data;
}

std::string Joined(const std::vector<absl::string_view>& views) {
  std::string out;
  for (absl::string_view v : views) out.append(v.data(), v.size());
  return out;
}

TEST(StreamCodecTest, ChunkResponsesAreWhatProtobufSerializes) {
  for (int index : {0, 1, 127, 128, 300, INT_MAX}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{70000}}) {
      const std::string data = Data(n);
      v1::StreamResponse expected;
      expected.mutable_chunk()->set_index(index);
      expected.mutable_chunk()->set_data(data);
      EXPECT_EQ(Flatten(ChunkResponse(index, data, nullptr)), expected.SerializeAsString())
          << "index " << index << ", " << n << " bytes";
    }
  }
}

TEST(StreamCodecTest, ChunkResponsesHoldTheirOwnerUntilReleased) {
  auto owner = std::make_shared<std::string>(Data(1000));
  std::weak_ptr<std::string> weak = owner;
  grpc::ByteBuffer message = ChunkResponse(3, *owner, owner);
  owner.reset();
  EXPECT_FALSE(weak.expired());
  grpc::ByteBuffer copy = message;  // gRPC copies byte buffers by reference.
  message.Clear();
  EXPECT_FALSE(weak.expired());
  copy.Clear();
  EXPECT_TRUE(weak.expired());
}

TEST(StreamCodecTest, ChunksAreReadInPlaceFromAnySlicing) {
  for (int index : {0, 5, 1000}) {
    for (size_t n : {size_t{1}, size_t{300}, size_t{100000}}) {
      v1::StreamRequest request;
      request.mutable_chunk()->set_index(index);
      request.mutable_chunk()->set_data(Data(n));
      const std::string bytes = request.SerializeAsString();
      for (size_t slice : {size_t{1}, size_t{7}, size_t{4096}, bytes.size()}) {
        StreamRequestView view;
        view.raw = Split(bytes, slice);
        ASSERT_OK(ParseStreamRequest(&view));
        ASSERT_TRUE(view.message.has_chunk());
        EXPECT_EQ(view.message.chunk().index(), index);
        EXPECT_TRUE(view.message.chunk().data().empty()) << "read in place: the bytes stay in the slices";
        EXPECT_EQ(Joined(view.chunk_data), request.chunk().data()) << n << " bytes in slices of " << slice;
      }
    }
  }
}

// Writes a StreamRequest by hand, for encodings protobuf's own serializer never produces.
class Encoder {
 public:
  Encoder& Varint(int field, uint64_t value) {
    out_.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
        field, google::protobuf::internal::WireFormatLite::WIRETYPE_VARINT));
    out_.WriteVarint64(value);
    return *this;
  }
  Encoder& Bytes(int field, const std::string& bytes) {
    out_.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
        field, google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out_.WriteVarint32(static_cast<uint32_t>(bytes.size()));
    out_.WriteString(bytes);
    return *this;
  }
  std::string Done() {
    out_.Trim();
    return bytes_;
  }

 private:
  std::string bytes_;
  google::protobuf::io::StringOutputStream stream_{&bytes_};
  google::protobuf::io::CodedOutputStream out_{&stream_};
};

TEST(StreamCodecTest, EveryEncodingMeansWhatProtobufParses) {
  v1::StepHeader header;
  header.set_num_matrices(3);
  v1::MatrixSpec spec;
  spec.set_name("w");
  spec.add_shape(4);
  const std::string data = Data(500);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"data before index", Encoder().Bytes(3, Encoder().Bytes(2, data).Varint(1, 4).Done()).Done()},
      {"unknown fields in the chunk",
       Encoder().Bytes(3, Encoder().Varint(1, 4).Varint(9, 1).Bytes(2, data).Bytes(10, "x").Done()).Done()},
      {"two data fields: the last wins",
       Encoder().Bytes(3, Encoder().Bytes(2, "first").Varint(1, 2).Bytes(2, data).Done()).Done()},
      {"negative index",
       Encoder().Bytes(3, Encoder().Varint(1, static_cast<uint64_t>(-2)).Bytes(2, data).Done()).Done()},
      {"a chunk split over two fields (merged)",
       Encoder().Bytes(3, Encoder().Varint(1, 4).Done()).Bytes(3, Encoder().Bytes(2, data).Done()).Done()},
      {"a spec, then a chunk (oneof: the last)",
       Encoder().Bytes(2, spec.SerializeAsString()).Bytes(3, Encoder().Bytes(2, data).Done()).Done()},
      {"a chunk, then a spec",
       Encoder().Bytes(3, Encoder().Bytes(2, data).Done()).Bytes(2, spec.SerializeAsString()).Done()},
      {"header", Encoder().Bytes(1, header.SerializeAsString()).Done()},
      {"end", Encoder().Bytes(4, "").Done()},
      {"empty chunk", Encoder().Bytes(3, "").Done()},
  };
  for (const auto& [name, bytes] : cases) {
    v1::StreamRequest expected;
    ASSERT_TRUE(expected.ParseFromString(bytes)) << name;
    expected.DiscardUnknownFields();  // The server ignores them; a chunk read in place drops them.
    for (size_t slice : {size_t{3}, bytes.size()}) {
      StreamRequestView view;
      view.raw = Split(bytes, slice);
      ASSERT_OK(ParseStreamRequest(&view));
      v1::StreamRequest got = view.message;
      if (got.has_chunk()) {
        EXPECT_EQ(Joined(view.chunk_data), expected.chunk().data()) << name;
        got.mutable_chunk()->set_data(Joined(view.chunk_data));
      } else {
        EXPECT_TRUE(view.chunk_data.empty()) << name;
      }
      EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString()) << name;
    }
  }
}

TEST(StreamCodecTest, BytesThatAreNotAStreamRequestAreInvalidArgument) {
  const std::string data = Data(100);
  const std::string whole = Encoder().Bytes(3, Encoder().Varint(1, 1).Bytes(2, data).Done()).Done();
  for (const std::string& bytes : {whole.substr(0, whole.size() - 10), std::string("\xff\xff\xff", 3)}) {
    StreamRequestView view;
    view.raw = Split(bytes, 16);
    EXPECT_THAT(ParseStreamRequest(&view),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a StreamRequest")));
  }
}

}  // namespace
}  // namespace orthoserve
