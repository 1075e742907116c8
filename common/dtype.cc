// Implementation of common/dtype.h: bit-exact conversions without hardware half support.
#include "common/dtype.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/vector_clones.h"

namespace orthoserve {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t LoadU16(const void* src, size_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(src) + 2 * i, sizeof(v));
  return v;
}

// The index of the first of `count` unaligned `Bits` values at `data` whose `mask` bits are all
// set (the exponent of a NaN or Inf), or -1. Blocks of a constant size are counted first — a
// loop without an early exit, which compilers vectorize — and only a block that holds one is
// searched element by element.
template <typename Bits>
ORTHOSERVE_VECTOR_CLONES int64_t FindAllOnes(const void* data, size_t count, Bits mask) {
  constexpr size_t kBlock = 256;
  const char* p = static_cast<const char*>(data);
  auto at = [p](size_t i) {
    Bits bits;
    std::memcpy(&bits, p + i * sizeof(Bits), sizeof(Bits));
    return bits;
  };
  size_t start = 0;
  for (; start + kBlock <= count; start += kBlock) {
    int found = 0;
    for (size_t i = 0; i < kBlock; ++i) found += (at(start + i) & mask) == mask;
    if (found > 0) break;
  }
  for (size_t i = start; i < count; ++i) {
    if ((at(i) & mask) == mask) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

size_t ElementSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "unknown";
}

absl::Status ParseDType(absl::string_view text, DType* dtype) {
  if (text == "fp32" || text == "float32") *dtype = DType::kF32;
  else if (text == "bf16" || text == "bfloat16") *dtype = DType::kBF16;
  else if (text == "fp16" || text == "float16") *dtype = DType::kF16;
  else
    return absl::InvalidArgumentError(absl::StrCat("dtype \"", text, "\" is not one of fp32, bf16, fp16"));
  return absl::OkStatus();
}

uint16_t FloatToBf16(float value) {
  uint32_t bits = FloatBits(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep sign and payload top, force quiet.
  }
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is the right
  // answer (it rounds up to the next binade, or to Inf past FLT_MAX).
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float Bf16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToHalf(float value) {
  uint32_t bits = FloatBits(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    return abs == 0x7f800000u ? static_cast<uint16_t>(sign | 0x7c00u)
                              : static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Rounds past 65504.
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: value = m * 2^-24 with m < 1024. Shift the full significand
    // (implicit bit included) and round to nearest even on the dropped bits.
    if (abs < 0x33000000u) return sign;  // Below half of the smallest subnormal: ±0.
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exponent;  // 14 .. 24 here.
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t rebased = abs - 0x38000000u;
  uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

float HalfToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return BitsFloat(sign);
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

void ConvertToF32(DType dtype, const void* src, size_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) dst[i] = Bf16ToFloat(LoadU16(src, i));
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(LoadU16(src, i));
      return;
  }
}

void ConvertFromF32(DType dtype, const float* src, size_t count, void* dst) {
  char* out = static_cast<char*>(dst);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t v = FloatToBf16(src[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t v = FloatToHalf(src[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      return;
  }
}

namespace {
std::atomic<int64_t> scanned_elements{0};
}  // namespace

int64_t NonFiniteScannedElements() { return scanned_elements.load(std::memory_order_relaxed); }

int64_t FindNonFinite(DType dtype, const void* data, size_t count) {
  scanned_elements.fetch_add(static_cast<int64_t>(count), std::memory_order_relaxed);
  switch (dtype) {
    case DType::kF32: return FindAllOnes<uint32_t>(data, count, 0x7f800000u);
    case DType::kBF16: return FindAllOnes<uint16_t>(data, count, 0x7f80u);
    case DType::kF16: return FindAllOnes<uint16_t>(data, count, 0x7c00u);
  }
  return -1;
}

}  // namespace orthoserve
