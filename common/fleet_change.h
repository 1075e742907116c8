// The mark of a failure caused by a change of the fleet (its membership changed, or the
// generation's collective broke) rather than by the request: the client may retry the whole
// step even where the code alone (ABORTED, CANCELLED) would be final. Inside a process — the
// coordinator's log, the executor's outcomes, the step layer, the C++ client — the mark travels
// with the absl::Status as a payload, so that nothing can separate a status from its
// retryability. Across the wire it becomes the trailing metadata kRetryableKey
// (proto/convert/grpc_status.h) on a client's call and LogEntry.retryable in the fleet's log.
// Code that rebuilds a status from its code and message drops the mark; carry the status itself.
#pragma once


#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace orthoserve {

inline constexpr char kFleetChangePayload[] = "orthoserve.dev/retryable";
inline constexpr char kFleetChangeMark[] = "fleet-change";

// `status` marked as a fleet change; OK stays OK (a success is not retried).
inline absl::Status MarkFleetChange(absl::Status status) {
  if (!status.ok()) status.SetPayload(kFleetChangePayload, absl::Cord(kFleetChangeMark));
  return status;
}

// True when `status` carries the mark of MarkFleetChange.
inline bool IsFleetChange(const absl::Status& status) {
  if (status.ok()) return false;
  const absl::optional<absl::Cord> mark = status.GetPayload(kFleetChangePayload);
  return mark.has_value() && *mark == kFleetChangeMark;
}

}  // namespace orthoserve
