// Bytes of memory that processes on one host may share (a memfd's pages), named so that every
// process names the same bytes alike — which memory (the host's boot, the file's device and
// inode) and which bytes of it — and the one check made on such names: that no bytes a step
// writes are bytes it reads or writes elsewhere (docs/shared_memory.md). No I/O here: the server's
// region code (server/shm) fills the names in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orthoserve {

// Which memory: equal ids are the same memory on this host, in any process (one memfd handed
// over twice, or to two server processes, has one id). Zero: unknown memory, which overlaps
// nothing (never compared).
struct MemoryId {
  uint64_t host = 0;    // The host's boot (a hash of /proc/sys/kernel/random/boot_id).
  uint64_t device = 0;  // The file's st_dev (a marker for memory that only one process can name).
  uint64_t inode = 0;   // The file's st_ino.

  bool known() const { return host != 0 || device != 0 || inode != 0; }
  bool operator==(const MemoryId& o) const { return host == o.host && device == o.device && inode == o.inode; }
  bool operator!=(const MemoryId& o) const { return !(*this == o); }
  bool operator<(const MemoryId& o) const {
    if (host != o.host) return host < o.host;
    if (device != o.device) return device < o.device;
    return inode < o.inode;
  }
};

// Bytes [offset, offset + bytes) of memory `memory` (offset from the start of the file).
struct SharedSpan {
  MemoryId memory;
  int64_t offset = 0;
  int64_t bytes = 0;

  // Both known, non-empty, of the same memory, sharing at least one byte (computed without
  // overflow for offsets and sizes >= 0).
  bool Overlaps(const SharedSpan& o) const {
    if (!memory.known() || memory != o.memory || bytes <= 0 || o.bytes <= 0) return false;
    // [a, a + n) and [b, b + m) overlap iff a - b < m and b - a < n (a, b >= 0: no overflow).
    return offset - o.offset < o.bytes && o.offset - offset < bytes;
  }
};

// One use of a span by a step: whose (a trainer rank, or 0 in a step of one), for which matrix,
// and whether the step writes it (a result) or only reads it (an input).
struct SpanUse {
  SharedSpan span;
  bool writes = false;
  int who = 0;
  int matrix = 0;
};

// The first pair of `uses` (by position) that overlap where at least one of the two writes:
// inputs may overlap inputs (both only read), nothing may overlap a result. Nullopt when there is
// none. O(n log n) in the number of uses.
std::optional<std::pair<size_t, size_t>> FirstWriteOverlap(const std::vector<SpanUse>& uses);

// "trainer rank R's result slice of matrix M" (or "input slice"), for messages about `use`.
std::string SpanUseText(const SpanUse& use);

}  // namespace orthoserve
