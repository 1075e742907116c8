// Bytes as gRPC may hand a message over: a ByteBuffer of several slices (tests/fuzz).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace orthoserve::fuzz {

// `bytes` in slices of `slice` bytes each (the last shorter); one slice when `slice` is 0.
inline grpc::ByteBuffer SlicedBuffer(absl::string_view bytes, size_t slice) {
  if (slice == 0) slice = std::max<size_t>(bytes.size(), 1);
  std::vector<grpc::Slice> slices;
  for (size_t offset = 0; offset < bytes.size(); offset += slice) {
    slices.emplace_back(bytes.data() + offset, std::min(slice, bytes.size() - offset));
  }
  if (slices.empty()) slices.emplace_back();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The bytes of `buffer`, in one string.
inline std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

inline std::string Joined(const std::vector<absl::string_view>& views) {
  std::string out;
  for (absl::string_view v : views) out.append(v.data(), v.size());
  return out;
}

}  // namespace orthoserve::fuzz
