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
  DType dtype = DType::kF32;   // '<f4' is kF32, '<f2' is kF16, '<V2' (opt-in, see below) is kBF16.
  std::vector<int64_t> shape;  // Any rank, including 0-d; dims >= 0.
  std::vector<char> data;      // prod(shape) · ElementSize(dtype) bytes, C order.
};

struct NpyReadOptions {
  // NumPy has no bfloat16: ml_dtypes' bfloat16 arrays are saved as 2-byte void ('<V2' or '|V2').
  // When set, such files are read as kBF16; otherwise they are rejected with a hint.
  bool void2_as_bf16 = false;
};

// Parses a whole .npy file. INVALID_ARGUMENT naming the problem for: a bad magic string, a version
// other than 1.0/2.0/3.0, a truncated or unterminated header, a header that is not the dict
// {'descr', 'fortran_order', 'shape'}, a descr other than '<f4'/'<f2' (or '<V2' with
// void2_as_bf16; big-endian and other types are named), fortran_order True, a malformed shape, or
// data bytes that do not match the shape.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, const NpyReadOptions& options = {});

// The .npy encoding of `array` (version 1.0, or 2.0 when the header needs it; header padded to 64
// bytes); kBF16 is written as '<V2' (load with np.load(...).view(ml_dtypes.bfloat16)).
// INVALID_ARGUMENT when data does not match the shape.
absl::StatusOr<std::string> EncodeNpy(const NpyArray& array);

// File wrappers: NOT_FOUND / PERMISSION_DENIED-like I/O failures are reported as the code below
// with the path in the message (NOT_FOUND when it cannot be opened, DATA_LOSS on a failed read or
// write), parse errors as ParseNpy's.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path, const NpyReadOptions& options = {});
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace orthoserve::client
