// The MEDIUM precision rounding on fp32 storage, inline so loops over whole matrices vectorize.
#pragma once

#include <cstdint>
#include <cstring>

#include "server/engine/cpu/elementwise.h"

namespace orthoserve {

// Bit for bit common/dtype.h's RoundToBf16 (round to nearest even on the 16 dropped bits; NaN
// keeps its sign and top payload and is made quiet); engine_test checks the two agree.
inline float RoundToBf16Inline(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  bits = nan ? ((bits | 0x00400000u) & 0xffff0000u) : ((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Rounds `count` values to bf16 in place.
inline void RoundToBf16InPlace(float* values, int64_t count) {
  ForEachElement(count, [values](int64_t i) { values[i] = RoundToBf16Inline(values[i]); });
}

}  // namespace orthoserve
