// Element types on the wire and their conversions to and from fp32.
//
// bf16 and fp16 are carried as raw uint16_t bit patterns. Narrowing rounds to nearest, ties to
// even; NaN stays NaN (quiet, sign kept); values beyond the target's range become ±Inf (fp16) —
// bf16 shares fp32's exponent range, so only values that round past FLT_MAX overflow. fp16
// subnormals are produced and read exactly. All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve {

enum class DType { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element: 4 for kF32, 2 for kBF16 and kF16.
size_t ElementSize(DType dtype);

// "fp32", "bf16", "fp16".
absl::string_view DTypeName(DType dtype);

// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"; INVALID_ARGUMENT otherwise.
absl::Status ParseDType(absl::string_view text, DType* dtype);

uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

// Rounds an fp32 value to the nearest bf16 and widens it back (the MEDIUM precision rounding).
inline float RoundToBf16(float value) { return Bf16ToFloat(FloatToBf16(value)); }

// Widens `count` elements of `dtype` at `src` (little-endian, unaligned allowed) into `dst`.
void ConvertToF32(DType dtype, const void* src, size_t count, float* dst);

// Narrows `count` fp32 values into `dtype` at `dst`.
void ConvertFromF32(DType dtype, const float* src, size_t count, void* dst);

// Returns the index of the first NaN or Inf among `count` elements of `dtype`, or -1 if all are
// finite.
int64_t FindNonFinite(DType dtype, const void* data, size_t count);

// Elements FindNonFinite has looked at in this process: tests count that an input is scanned
// once on its way.
int64_t NonFiniteScannedElements();

}  // namespace orthoserve
