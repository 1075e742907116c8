// The mark of a transient refusal and the delay after which a retry may succeed: a tenant's fair
// share or the server's slots, bytes or call rate used up for a moment (RESOURCE_EXHAUSTED). A
// RESOURCE_EXHAUSTED without the mark is final (a request larger than any limit). Inside a process
// the mark travels with the absl::Status as a payload, as the fleet-change mark does
// (common/fleet_change.h); across the wire it becomes the trailing metadata kRetryAfterKey
// (proto/convert/grpc_status.h): the delay in whole milliseconds, which both clients wait at least
// before they retry.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"

namespace orthoserve {

inline constexpr char kRetryAfterPayload[] = "orthoserve.dev/retry-after-ms";
// The delay of a refusal that has no better estimate (a slot or bytes held by other calls): about
// what a short call takes, so that a retry neither spins nor waits long after room was made.
inline constexpr absl::Duration kBusyRetryAfter = absl::Milliseconds(200);
// The longest delay a mark carries (and a client honours): longer waits are the retry policy's.
inline constexpr absl::Duration kMaxRetryAfter = absl::Seconds(10);

// `status` marked as transient, retryable after `delay` (clamped to [1 ms, kMaxRetryAfter]); OK
// stays OK.
inline absl::Status MarkRetryAfter(absl::Status status, absl::Duration delay) {
  if (status.ok()) return status;
  const int64_t ms = absl::ToInt64Milliseconds(std::clamp(delay, absl::Milliseconds(1), kMaxRetryAfter));
  status.SetPayload(kRetryAfterPayload, absl::Cord(std::to_string(ms)));
  return status;
}

// The delay of a MarkRetryAfter mark, or nullopt (unmarked, OK, or a mark that does not parse as
// milliseconds in range).
inline std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  const absl::optional<absl::Cord> mark = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!mark.has_value() || !absl::SimpleAtoi(std::string(*mark), &ms)) return std::nullopt;
  if (ms < 1 || absl::Milliseconds(ms) > kMaxRetryAfter) return std::nullopt;
  return absl::Milliseconds(ms);
}

}  // namespace orthoserve
