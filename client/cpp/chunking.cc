// Implementation of client/cpp/chunking.h.
#include "client/cpp/chunking.h"

#include <algorithm>

namespace orthoserve::client {

std::vector<absl::string_view> SplitChunks(const void* data, size_t bytes, size_t chunk_bytes) {
  std::vector<absl::string_view> chunks;
  const char* p = static_cast<const char*>(data);
  chunks.reserve(bytes / chunk_bytes + 1);
  for (size_t offset = 0; offset < bytes; offset += chunk_bytes) {
    chunks.emplace_back(p + offset, std::min(chunk_bytes, bytes - offset));
  }
  return chunks;
}

size_t EffectiveChunkBytes(size_t requested, const v1::Limits& limits) {
  size_t chunk = requested == 0 ? kDefaultChunkBytes : requested;
  if (limits.chunk_bytes() > 0) chunk = std::min(chunk, static_cast<size_t>(limits.chunk_bytes()));
  if (limits.max_message_bytes() > 0) {
    const size_t max_message = static_cast<size_t>(limits.max_message_bytes());
    chunk = std::min(chunk, max_message > kChunkFramingBytes ? max_message - kChunkFramingBytes : size_t{1});
  }
  return std::max<size_t>(chunk, 1);
}

}  // namespace orthoserve::client
