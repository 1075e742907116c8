// .npy encoding round trips and every header error of client/cpp/npy.h.
#include "client/cpp/npy.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::client {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

NpyArray F32(std::vector<int64_t> shape, float first) {
  NpyArray a;
  a.dtype = DType::kF32;
  a.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  a.data.resize(n * 4);
  for (int64_t i = 0; i < n; ++i) {
    float v = first + static_cast<float>(i) * 0.5f;
    std::memcpy(a.data.data() + i * 4, &v, 4);
  }
  return a;
}

// A file with the given version and header dict text (padded and newline-terminated), then `data`.
std::string Raw(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  return out + header + data;
}

TEST(Npy, RoundTripsFloat32TwoD) {
  NpyArray a = F32({3, 4}, 1.0f);
  auto bytes = EncodeNpy(a);
  ASSERT_OK(bytes);
  EXPECT_EQ(bytes->size() % 64, a.data.size() % 64);  // Header padded to 64 bytes.
  EXPECT_EQ((bytes->size() - a.data.size()) % 64, 0u);
  auto back = ParseNpy(*bytes);
  ASSERT_OK(back);
  EXPECT_EQ(back->dtype, DType::kF32);
  EXPECT_EQ(back->shape, a.shape);
  EXPECT_EQ(back->data, a.data);
}

TEST(Npy, RoundTripsFloat16NdAndOneD) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2, 3, 5}, std::vector<int64_t>{7}, std::vector<int64_t>{}}) {
    NpyArray a;
    a.dtype = DType::kF16;
    a.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = FloatToHalf(static_cast<float>(i) - 3.0f);
      a.data.push_back(static_cast<char>(h & 0xff));
      a.data.push_back(static_cast<char>(h >> 8));
    }
    auto bytes = EncodeNpy(a);
    ASSERT_OK(bytes);
    auto back = ParseNpy(*bytes);
    ASSERT_OK(back);
    EXPECT_EQ(back->dtype, DType::kF16);
    EXPECT_EQ(back->shape, shape);
    EXPECT_EQ(back->data, a.data);
  }
}

TEST(Npy, EncodesTheHeaderNumpyWrites) {
  auto bytes = EncodeNpy(F32({2, 3}, 0.0f));
  ASSERT_OK(bytes);
  EXPECT_THAT(*bytes, HasSubstr("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
  auto one_d = EncodeNpy(F32({5}, 0.0f));
  ASSERT_OK(one_d);
  EXPECT_THAT(*one_d, HasSubstr("'shape': (5,)"));
}

TEST(Npy, AcceptsVersionsTwoAndThreeAndAnyKeyOrder) {
  const std::string data(2 * 2 * 4, '\0');
  for (int major : {2, 3}) {
    auto a = ParseNpy(Raw("{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}", data, major));
    ASSERT_OK(a);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  }
}

TEST(Npy, FileRoundTrip) {
  const std::string path = ::testing::TempDir() + "/npy_test_roundtrip.npy";
  NpyArray a = F32({4, 2}, -2.0f);
  ASSERT_OK(WriteNpy(path, a));
  auto back = ReadNpy(path);
  ASSERT_OK(back);
  EXPECT_EQ(back->data, a.data);
  std::remove(path.c_str());
  EXPECT_THAT(ReadNpy(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(Npy, RejectsBadMagic) {
  std::string bytes = Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }", std::string(4, '\0'));
  bytes[1] = 'X';
  EXPECT_THAT(ParseNpy(bytes), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  EXPECT_THAT(ParseNpy("abc"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
}

TEST(Npy, RejectsUnknownVersions) {
  std::string bytes = Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }", std::string(4, '\0'));
  bytes[6] = 4;
  EXPECT_THAT(ParseNpy(bytes), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version 4.0")));
  bytes[6] = 1;
  bytes[7] = 1;
  EXPECT_THAT(ParseNpy(bytes), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version 1.1")));
}

TEST(Npy, RejectsTruncatedHeaders) {
  const std::string bytes = Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }", "");
  EXPECT_THAT(ParseNpy(bytes.substr(0, 9)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("header length")));
  EXPECT_THAT(ParseNpy(bytes.substr(0, 40)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  std::string no_newline = bytes;
  no_newline.back() = ' ';
  EXPECT_THAT(ParseNpy(no_newline), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("newline")));
}

TEST(Npy, RejectsUnsupportedDtypes) {
  const std::string d(8, '\0');
  EXPECT_THAT(ParseNpy(Raw("{'descr': '>f4', 'fortran_order': False, 'shape': (1, 2), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("big-endian")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'<f8' is not supported")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'<i4' is not supported")));
}

TEST(Npy, RejectsFortranOrder) {
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 1), }", std::string(8, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Fortran order")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 1), }", std::string(8, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'fortran_order' is \"0\"")));
}

TEST(Npy, RejectsMalformedShapes) {
  const std::string d(8, '\0');
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 1], }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tuple")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"-1\" is not a non-negative integer")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2 1), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"x\"")));
}

TEST(Npy, RejectsMissingRepeatedOrUnknownKeys) {
  const std::string d(8, '\0');
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'shape': (2, 1), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lacks")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeated header key 'descr'")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), 'x': 1}", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x'")));
  EXPECT_THAT(ParseNpy(Raw("('descr', '<f4')", d)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dict")));
  EXPECT_THAT(ParseNpy(Raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1)} x", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after the header")));
  EXPECT_THAT(ParseNpy(Raw("{'descr: '<f4', 'fortran_order': False, 'shape': (2, 1)}", d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("':'")));
}

TEST(Npy, RejectsDataOfTheWrongSize) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_THAT(
      ParseNpy(Raw(dict, std::string(23, '\0'))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 24 data bytes, the file has 23 (truncated)")));
  EXPECT_THAT(ParseNpy(Raw(dict, std::string(25, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(trailing bytes)")));
}

TEST(Npy, Bf16TravelsAsTwoByteVoidOnlyWhenAskedFor) {
  NpyArray a;
  a.dtype = DType::kBF16;
  a.shape = {2, 2};
  for (float v : {1.0f, -2.0f, 0.5f, 3.0f}) {
    const uint16_t b = FloatToBf16(v);
    a.data.push_back(static_cast<char>(b & 0xff));
    a.data.push_back(static_cast<char>(b >> 8));
  }
  auto bytes = EncodeNpy(a);
  ASSERT_OK(bytes);
  EXPECT_THAT(*bytes, HasSubstr("'descr': '<V2'"));
  EXPECT_THAT(ParseNpy(*bytes), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--bf16")));
  NpyReadOptions options;
  options.void2_as_bf16 = true;
  auto back = ParseNpy(*bytes, options);
  ASSERT_OK(back);
  EXPECT_EQ(back->dtype, DType::kBF16);
  EXPECT_EQ(back->data, a.data);
  auto pipe = ParseNpy(Raw("{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }", std::string(4, '\0')), options);
  ASSERT_OK(pipe);
  EXPECT_EQ(pipe->dtype, DType::kBF16);
}

TEST(Npy, EncodeRejectsMismatchedData) {
  NpyArray b = F32({2, 2}, 0.0f);
  b.data.pop_back();
  EXPECT_THAT(EncodeNpy(b), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 16")));
}

}  // namespace
}  // namespace orthoserve::client
