// How the client cuts a block's bytes into DataChunks and picks the chunk size.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/strings/string_view.h"
#include "orthoserve/v1/orthogonalizer.pb.h"

namespace orthoserve::client {

inline constexpr size_t kDefaultChunkBytes = size_t{4} << 20;  // 4 MiB (docs/architecture.md: 1–4 MiB).

// Bytes of framing a DataChunk message adds around its data (field tags, lengths, index) — an
// upper bound used to keep a chunk message under a message-size limit.
inline constexpr size_t kChunkFramingBytes = 64;

// Views of `bytes` bytes at `data` in order: every chunk exactly `chunk_bytes` long except the last,
// which holds the rest (1..chunk_bytes). Zero bytes give no chunks. Requires chunk_bytes > 0.
// The views alias `data`.
std::vector<absl::string_view> SplitChunks(const void* data, size_t bytes, size_t chunk_bytes);

// The chunk size to send with: `requested` (kDefaultChunkBytes when 0), lowered to the server's
// `limits.chunk_bytes` and to its `limits.max_message_bytes` less framing when those are set (> 0).
// Never below 1.
size_t EffectiveChunkBytes(size_t requested, const v1::Limits& limits);

}  // namespace orthoserve::client
