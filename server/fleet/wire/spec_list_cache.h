// Decodes the spec lists of ready reports (ReadyReport.spec_list, a serialized SpecList) once per
// distinct list. Every trainer rank of a step sends the same list, and so does every notice of a
// kept step: the W reports of a step carry W copies of the same bytes. The first is decoded; the
// others are a lookup — a hash and an exact comparison of the bytes, never the hash alone — that
// returns the same shared list, which the rendezvous then recognizes by pointer instead of
// comparing W lists field by field (Rendezvous::Hold). Holds the `capacity` lists used last.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/fleet/logic/group_step.h"

namespace orthoserve {

class SpecListCache {
 public:
  explicit SpecListCache(size_t capacity = 16) : capacity_(capacity == 0 ? 1 : capacity) {}

  // The list `bytes` encodes: the one already decoded from identical bytes, or a new decode
  // (INVALID_ARGUMENT naming the matrix when it does not decode: see MatrixPlanFromProto).
  absl::StatusOr<SharedSpecs> Decode(const std::string& bytes);

  // Lists decoded so far (lookups that found theirs do not count).
  int64_t decoded() const {
    absl::MutexLock lock(&mu_);
    return decoded_;
  }

 private:
  struct Entry {
    uint64_t hash = 0;
    std::string bytes;
    SharedSpecs specs;
    uint64_t used = 0;  // use_clock_ at its last use.
  };
  // The held entry of `bytes`; null when none.
  Entry* FindLocked(uint64_t hash, const std::string& bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decoded_ ABSL_GUARDED_BY(mu_) = 0;
};

// Decodes a serialized SpecList without a cache (INVALID_ARGUMENT when it does not parse or a
// plan does not decode).
absl::StatusOr<SpecList> DecodeSpecList(const std::string& bytes);

}  // namespace orthoserve
