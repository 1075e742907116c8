// Store: the rendezvous key-value store through which a fleet's ranks find each other (Gloo
// transport addresses, the NCCL unique id, public endpoints).
//
// Contract. Keys are set once per fleet generation (Set overwrites); Get blocks until the key
// exists or the timeout passes (DEADLINE_EXCEEDED naming the key); Add atomically adds to an
// integer counter (created at 0) and returns the new value. UNAVAILABLE when the store's
// server cannot be reached. Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace orthoserve {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
  // Waits until every key exists.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace orthoserve
