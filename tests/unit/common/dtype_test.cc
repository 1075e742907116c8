// Conversion edge cases of common/dtype.h, checked against exhaustive and known bit patterns.
#include "common/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Bf16, RoundTripsEveryBf16Value) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = Bf16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
      continue;
    }
    EXPECT_EQ(FloatToBf16(f), bits) << bits;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000u)), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000u)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001u)), 0x3f81);
  // Negative values round symmetrically.
  EXPECT_EQ(FloatToBf16(FromBits(0xbf808001u)), 0xbf81);
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  // A NaN whose payload lies only in the low bits must stay NaN, not become Inf.
  uint16_t nan = FloatToBf16(FromBits(0x7f800001u));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(-std::nanf("")))));
  EXPECT_EQ(FloatToBf16(-std::nanf("")) & 0x8000, 0x8000);
  // FLT_MAX rounds past the largest bf16 to Inf.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  // Subnormal fp32 values survive (bf16 has fp32's exponent range).
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000u)), 0x0001);
}

TEST(Half, RoundTripsEveryHalfValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), bits) << bits;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);            // Below the overflow midpoint.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);             // Ties to even: Inf.
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // Smallest subnormal.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // Half of it: ties to even (0).
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: ties to even (2).
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // Rounds up into the normals.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // Tie to even.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(FromBits(0x7f800001u)))));
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(Half, MatchesDoubleRoundingOnRandomFloats) {
  // Independent check: nearest representable half by brute-force search over neighbours.
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f = FromBits((state & 0x807fffffu) | ((100u + (state >> 24) % 45u) << 23));  // |f| in ~[2^-27, 2^17].
    uint16_t h = FloatToHalf(f);
    double got = HalfToFloat(h);
    if (std::isinf(got)) {
      EXPECT_GE(std::fabs(f), 65520.0f);
      continue;
    }
    double err = std::fabs(got - f);
    for (int d : {-1, 1}) {
      uint16_t n = static_cast<uint16_t>(h + d);
      double other = HalfToFloat(n);
      if (std::isnan(other) || std::isinf(other) || (n & 0x7fff) == 0x7fff) continue;
      if ((n & 0x8000) != (h & 0x8000)) continue;
      double other_err = std::fabs(other - f);
      EXPECT_TRUE(err < other_err || (err == other_err && (h & 1) == 0)) << f;
    }
  }
}

TEST(Convert, BulkRoundTrip) {
  const float in[] = {0.0f, 1.0f, -3.5f, 1e-3f, 123.25f};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<char> raw(5 * ElementSize(dtype));
    ConvertFromF32(dtype, in, 5, raw.data());
    float out[5];
    ConvertToF32(dtype, raw.data(), 5, out);
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(out[i], in[i], std::fabs(in[i]) * 1e-2) << DTypeName(dtype);
  }
}

TEST(Convert, FindNonFinite) {
  float data[] = {1.0f, 2.0f, std::numeric_limits<float>::infinity(), 3.0f};
  EXPECT_EQ(FindNonFinite(DType::kF32, data, 4), 2);
  EXPECT_EQ(FindNonFinite(DType::kF32, data, 2), -1);
  uint16_t bf[] = {0x3f80, 0x7fc0};
  EXPECT_EQ(FindNonFinite(DType::kBF16, bf, 2), 1);
  uint16_t h[] = {0x3c00, 0x3c00, 0xfc00};
  EXPECT_EQ(FindNonFinite(DType::kF16, h, 3), 2);
}

TEST(Convert, FindNonFiniteFindsTheFirstInLongArrays) {
  // Long arrays are scanned in blocks; the first NaN or Inf must be found wherever it lies
  // (first and last element of a block, a later block, the tail past the last whole block),
  // the first of two wins, and the largest finite values are not flagged.
  const size_t count = 256 * 4 + 37;
  struct Kind {
    DType dtype;
    uint32_t finite_max, inf, nan;
  };
  for (const Kind& k : {Kind{DType::kF32, 0x7f7fffffu, 0x7f800000u, 0xffc00001u},
                        Kind{DType::kBF16, 0x7f7fu, 0xff80u, 0x7fc1u}, Kind{DType::kF16, 0x7bffu, 0x7c00u, 0xfe01u}}) {
    const size_t elem = ElementSize(k.dtype);
    std::vector<char> data(count * elem);
    auto set = [&](size_t i, uint32_t bits) { std::memcpy(data.data() + i * elem, &bits, elem); };
    for (size_t i = 0; i < count; ++i) set(i, k.finite_max);
    EXPECT_EQ(FindNonFinite(k.dtype, data.data(), count), -1) << DTypeName(k.dtype);
    for (size_t bad : {size_t{0}, size_t{255}, size_t{256}, size_t{700}, size_t{1024}, count - 1}) {
      set(bad, bad % 2 ? k.inf : k.nan);
      EXPECT_EQ(FindNonFinite(k.dtype, data.data(), count), static_cast<int64_t>(bad)) << DTypeName(k.dtype);
      EXPECT_EQ(FindNonFinite(k.dtype, data.data(), bad), -1) << DTypeName(k.dtype) << " " << bad;
      set(count - 1, k.inf);
      EXPECT_EQ(FindNonFinite(k.dtype, data.data(), count), static_cast<int64_t>(bad)) << DTypeName(k.dtype);
      set(bad, k.finite_max);
      set(count - 1, k.finite_max);
    }
    // Unaligned data.
    std::vector<char> shifted(data.size() + 1);
    std::memcpy(shifted.data() + 1, data.data(), data.size());
    std::memcpy(shifted.data() + 1 + 300 * elem, &k.inf, elem);
    EXPECT_EQ(FindNonFinite(k.dtype, shifted.data() + 1, count), 300) << DTypeName(k.dtype);
  }
}

TEST(Convert, ParseDType) {
  DType d;
  EXPECT_OK(ParseDType("bf16", &d));
  EXPECT_EQ(d, DType::kBF16);
  EXPECT_OK(ParseDType("float16", &d));
  EXPECT_EQ(d, DType::kF16);
  EXPECT_THAT(ParseDType("int8", &d),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("fp32, bf16, fp16")));
}

}  // namespace
}  // namespace orthoserve
