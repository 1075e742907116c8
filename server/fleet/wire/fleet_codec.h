// Wire forms of the coordinator's reports and log entries (orthoserve.fleet.v1).
#pragma once

#include "absl/status/statusor.h"
#include "orthoserve/fleet/v1/fleet.pb.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/wire/spec_list_cache.h"

namespace orthoserve {

// The version of proto/orthoserve/fleet/v1/fleet.proto's protocol this binary speaks. Raise it with
// every incompatible change to that file: ranks of different protocols never form a fleet. 1 was
// the protocol that carried the public MatrixSpec (its binaries did not announce it); 2 carries
// the fleet's own MatrixPlan; 3 adds the run to every step key, report digests and the aborting member;
// 4 sends a report's spec list as one SpecList and its blocks packed, places a log entry's blocks
// by rule where they follow one, and ReadLog entries encoded once for every reader; 5 reports a trainer
// rank's shared-memory slices (ReadyReport.region_spans), which the coordinator checks across ranks;
// 6 carries NsOptions.normalization in plans (a rank of 5 would normalize a bf16 plan in fp32).
inline constexpr int kFleetProtocol = 6;
// The largest message on the fleet port, either way (every rank's server and channels).
inline constexpr int kFleetMessageBytes = 256 << 20;
// The largest log entry the coordinator appends: one entry always fits in a ReadLog response,
// with room for the response's framing.
inline constexpr size_t kMaxFleetEntryBytes = static_cast<size_t>(kFleetMessageBytes) - (1 << 20);
// The largest trainer world a report or log entry may carry: --max-group-world's bound
// (kMaxGroupWorld, server/rpc/service_state.h; tests/unit/fleet/wire_bounds_test.cc holds them
// equal). A coordinator sizes what it keeps for a step's replays by it.
inline constexpr int kMaxFleetTrainerWorld = 1 << 16;
// The store key under which a coordinator's fleet service answers its protocol (FleetService::StoreGet).
inline constexpr char kFleetProtocolKey[] = "fleet/protocol";

fleet::v1::GroupKey GroupKeyToProto(const GroupKey& key);
GroupKey GroupKeyFromProto(const fleet::v1::GroupKey& proto);

// Matrices travel as the fleet's own MatrixPlan (server/fleet/wire/plan_codec.h), decoded
// structurally only: their validity is checked where they enter the fleet (ParseMatrixSpec), by
// the coordinator's agreement check and by ValidatePlan on every rank, not here.
// A report's spec list as ReadyReport.spec_list carries it (a serialized SpecList). A sender of
// several reports of one list may encode it once and pass it to ReadyReportToProto.
std::string SpecListToBytes(const SpecList& specs);
// `spec_list`: SpecListToBytes(*report.sent.specs) when the caller has it; null: encoded here.
fleet::v1::ReadyReport ReadyReportToProto(const ReadyReport& report, const std::string* spec_list = nullptr);
// INVALID_ARGUMENT naming the matrix when a plan does not decode (MatrixPlanFromProto: a corrupt
// message, or a rank of another version), when the blocks are not 4 numbers per matrix, or when
// the trainer world is over kMaxFleetTrainerWorld. Blocks are taken as they are. With `cache`, a list decoded before from identical bytes is
// shared (SpecListCache); without, the list is decoded.
absl::StatusOr<ReadyReport> ReadyReportFromProto(const fleet::v1::ReadyReport& proto, SpecListCache* cache = nullptr);

fleet::v1::Member MemberToProto(const Member& member);
Member MemberFromProto(const fleet::v1::Member& proto);

// A batch's placements go by rule (fleet.proto, BlockRule) wherever the rule gives them back
// exactly — torch.chunk over W along rows or columns, trainer rank r on the same fleet rank for
// every such matrix — and explicitly otherwise.
fleet::v1::LogEntry LogEntryToProto(const LogEntry& entry);
// INVALID_ARGUMENT naming the matrix when a plan does not decode (as ReadyReportFromProto), or
// its block rule is unknown or lacks the entry's fleet ranks.
absl::StatusOr<LogEntry> LogEntryFromProto(const fleet::v1::LogEntry& proto);

}  // namespace orthoserve
