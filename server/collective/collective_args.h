// Argument checks and segment arithmetic shared by the Collective implementations, so every
// implementation rejects the same malformed calls with the same INVALID_ARGUMENT messages.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace orthoserve::collective_internal {

// INVALID_ARGUMENT unless send_bytes and recv_bytes both have `world` entries and the segment
// to self agrees (send_bytes[rank] == recv_bytes[rank]).
absl::Status CheckAllToAllvArgs(int rank, int world, absl::Span<const size_t> send_bytes,
                                absl::Span<const size_t> recv_bytes);

// INVALID_ARGUMENT unless recv_bytes has `world` entries and recv_bytes[rank] == send_bytes.
absl::Status CheckAllGathervArgs(int rank, int world, size_t send_bytes, absl::Span<const size_t> recv_bytes);

// INVALID_ARGUMENT unless 0 <= root < world.
absl::Status CheckRoot(int root, int world);

// Byte offsets of back-to-back segments: result[p] is the sum of bytes[0..p); result has
// bytes.size() + 1 entries, the last being the total.
std::vector<size_t> SegmentOffsets(absl::Span<const size_t> bytes);

// Balanced split of `n` elements over `world` ranks: rank r owns [ChunkBegin(n, world, r),
// ChunkBegin(n, world, r + 1)); the first n % world chunks are one element longer.
size_t ChunkBegin(size_t n, int world, int r);

// The status every call on a broken collective returns: UNAVAILABLE naming `name` and the
// error that broke it.
absl::Status BrokenStatus(const char* name, const absl::Status& cause);

}  // namespace orthoserve::collective_internal
