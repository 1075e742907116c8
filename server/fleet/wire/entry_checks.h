// What a member checks in a log entry from a remote coordinator before its executor takes it
// (RemoteLogSource::Read). The executor indexes a batch's placements, submissions, digests and
// cached flags by trainer rank, so their sizes must agree with the batch's trainer world; what
// the plan says (shapes, blocks, algorithms, fleet ranks) is ValidatePlan's business, the same on
// every rank. A batch that fails is run as a failure of its step, so that the trainers waiting
// for it get an answer and the log goes on.
#pragma once

#include "absl/status/status.h"
#include "server/fleet/logic/fleet_log.h"

namespace orthoserve {

// OK for a membership or failure entry, and for a batch whose shape agrees: a trainer world of 1
// to kMaxFleetTrainerWorld and a fleet world of at least 1, exactly one placement per trainer
// rank in every matrix, one submission per trainer rank, digests and cached flags either none or
// one per trainer rank, and a part offset of at least 0. INVALID_ARGUMENT naming the first that
// disagrees. Pure.
absl::Status CheckBatchShape(const LogEntry& entry);

// `entry` (a batch) as the failure of its step: INTERNAL with `why`, failure "invalid"; index,
// generation and key kept, nothing else.
LogEntry UnusableBatch(const LogEntry& entry, const absl::Status& why);

}  // namespace orthoserve
