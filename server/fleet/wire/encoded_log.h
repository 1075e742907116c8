// The coordinator's log entries in their wire form (a serialized orthoserve.fleet.v1.LogEntry),
// encoded once per entry for all the members that read it. Every member reads every entry, and
// a batch entry of a big step took ~50 ms to encode: encoded per reader, the fan-out of one
// W = 1024, S = 64 step cost the coordinator 3 s of CPU (bench/results/plan_scale.md). An
// encoding lives as long as its entry is held by the log or a reader. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/fleet/logic/fleet_log.h"

namespace orthoserve {

class EncodedLog {
 public:
  using Bytes = std::shared_ptr<const std::string>;

  // LogEntryToProto(*entry), serialized: encoded by the first caller for this entry (others
  // asking meanwhile wait for it), the same bytes for every caller after.
  Bytes Encoded(const SharedLogEntry& entry);

  // Entries encoded so far (for tests and the benchmark).
  int64_t encodings() const {
    absl::MutexLock lock(&mu_);
    return encodings_;
  }

 private:
  struct Encoding {
    absl::once_flag once;
    std::shared_ptr<std::string> bytes;
  };
  struct Slot {
    std::weak_ptr<const LogEntry> entry;  // Expired: the slot is free to go.
    std::shared_ptr<Encoding> encoding;
  };

  mutable absl::Mutex mu_;
  absl::flat_hash_map<const LogEntry*, Slot> slots_ ABSL_GUARDED_BY(mu_);
  int64_t encodings_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace orthoserve
