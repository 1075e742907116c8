// Wire forms of the coordinator's reports and log entries (orthoserve.fleet.v1).
#pragma once

#include "absl/status/statusor.h"
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "server/fleet/logic/coordinator.h"

namespace orthoserve {

// The version of proto/orthoserve/fleet/v1/fleet.proto's protocol this binary speaks. Raise it with
// every incompatible change to that file: ranks of different protocols never form a fleet. 1 was
// the protocol that carried the public MatrixSpec (its binaries did not announce it); 2 carries
// the fleet's own MatrixPlan; 3 adds the run to every step key, report digests and the aborting member.
inline constexpr int kFleetProtocol = 3;
// The largest message on the fleet port, either way (every rank's server and channels).
inline constexpr int kFleetMessageBytes = 256 << 20;
// The largest log entry the coordinator appends: one entry always fits in a ReadLog response,
// with room for the response's framing.
inline constexpr size_t kMaxFleetEntryBytes = static_cast<size_t>(kFleetMessageBytes) - (1 << 20);
// The store key under which a coordinator's fleet service answers its protocol (FleetService::StoreGet).
inline constexpr char kFleetProtocolKey[] = "fleet/protocol";

fleet::v1::GroupKey GroupKeyToProto(const GroupKey& key);
GroupKey GroupKeyFromProto(const fleet::v1::GroupKey& proto);

// Matrices travel as the fleet's own MatrixPlan (server/fleet/wire/plan_codec.h), decoded
// structurally only: their validity is checked where they enter the fleet (ParseMatrixSpec), by
// the coordinator's agreement check and by ValidatePlan on every rank, not here.
fleet::v1::ReadyReport ReadyReportToProto(const ReadyReport& report);
// INVALID_ARGUMENT naming the matrix when a plan does not decode (MatrixPlanFromProto: a corrupt
// message, or a rank of another version). Blocks are taken as they are.
absl::StatusOr<ReadyReport> ReadyReportFromProto(const fleet::v1::ReadyReport& proto);

fleet::v1::Member MemberToProto(const Member& member);
Member MemberFromProto(const fleet::v1::Member& proto);

fleet::v1::LogEntry LogEntryToProto(const LogEntry& entry);
// INVALID_ARGUMENT naming the matrix when a plan does not decode (as ReadyReportFromProto).
absl::StatusOr<LogEntry> LogEntryFromProto(const fleet::v1::LogEntry& proto);

}  // namespace orthoserve
