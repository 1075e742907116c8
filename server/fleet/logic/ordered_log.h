// The coordinator's totally ordered log (coordinator.h): entries by index, from the first one a
// reading member may still ask for. Not thread-safe: the coordinator's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "server/fleet/logic/fleet_log.h"

namespace orthoserve {

class OrderedLog {
 public:
  // The index the next appended entry gets.
  int64_t end() const { return first_ + static_cast<int64_t>(entries_.size()); }
  // Appends `entry` as index end(); returns that index.
  int64_t Append(LogEntry entry);
  // The entries with index >= `from` that are still held (shared, not copied).
  std::vector<SharedLogEntry> From(int64_t from) const;
  // Forgets the entries below `index` (every reader has read them).
  void DropBefore(int64_t index);

 private:
  std::deque<SharedLogEntry> entries_;  // entries_.front()->index == first_.
  int64_t first_ = 0;
};

// An upper bound of the bytes batch `entry` takes in the fleet's log, as fleet_codec encodes it
// (LogEntryToProto): every varint counted at its widest (10 bytes, 11 with its tag), every
// length-delimited field with 6 bytes of tag and length, a block as 4 varints. Loose (a
// placement is ~15 bytes, counted as 62), and cheap: it reads sizes, it encodes nothing.
size_t LogEntryBytesBound(const LogEntry& entry);

}  // namespace orthoserve
