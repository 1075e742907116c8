// Reading and writing NumPy .npy files of little-endian, C-order float32/float16 arrays — the
// file format orthoctl exchanges matrices in. Header validation is strict: anything this code
// cannot read exactly is rejected with a message saying what and why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace orthoserve::client {

struct NpyArray {
  DType dtype = DType::kF32;    // '<f4' is kF32, '<f2' is kF16 (.npy has no bf16).
  std::vector<int64_t> shape;   // Any rank, including 0-d; dims >= 0.
  std::vector<char> data;       // prod(shape) · ElementSize(dtype) bytes, C order.
};

// Parses a whole .npy file. INVALID_ARGUMENT naming the problem for: a bad magic string, a version
// other than 1.0/2.0/3.0, a truncated or unterminated header, a header that is not the dict
// {'descr', 'fortran_order', 'shape'}, a descr other than '<f4'/'<f2' (big-endian and other types
// are named), fortran_order True, a malformed shape, or data bytes that do not match the shape.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes);

// The .npy encoding of `array` (version 1.0, or 2.0 when the header needs it; header padded to 64
// bytes). INVALID_ARGUMENT when data does not match the shape, or for bf16 (no .npy descr).
absl::StatusOr<std::string> EncodeNpy(const NpyArray& array);

// File wrappers: NOT_FOUND / PERMISSION_DENIED-like I/O failures are reported as the code below
// with the path in the message (NOT_FOUND when it cannot be opened, DATA_LOSS on a failed read or
// write), parse errors as ParseNpy's.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace orthoserve::client
