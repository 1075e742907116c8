// Wire forms of the coordinator's reports and log entries (orthoserve.fleet.v1).
#pragma once

#include "absl/status/statusor.h"
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "server/fleet/coordinator.h"

namespace orthoserve {

fleet::v1::GroupKey GroupKeyToProto(const GroupKey& key);
GroupKey GroupKeyFromProto(const fleet::v1::GroupKey& proto);

fleet::v1::ReadyReport ReadyReportToProto(const ReadyReport& report);
// INVALID_ARGUMENT when a spec does not parse (a peer running another version).
absl::StatusOr<ReadyReport> ReadyReportFromProto(const fleet::v1::ReadyReport& proto);

fleet::v1::Member MemberToProto(const Member& member);
Member MemberFromProto(const fleet::v1::Member& proto);

fleet::v1::LogEntry LogEntryToProto(const LogEntry& entry);
absl::StatusOr<LogEntry> LogEntryFromProto(const fleet::v1::LogEntry& proto);

}  // namespace orthoserve
