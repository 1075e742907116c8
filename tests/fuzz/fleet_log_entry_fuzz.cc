// Fuzz target: a log entry as a member reads it from a remote coordinator (RemoteLogSource::Read:
// LogEntryFromProto, server/fleet/wire/fleet_codec.h, then CheckBatchShape,
// server/fleet/wire/entry_checks.h), and the per-matrix checks every rank runs on a batch before
// its executor touches it (ValidatePlan, server/distributed/batch.h). Input: a serialized
// orthoserve.fleet.v1.LogEntry (inputs protobuf does not parse are skipped: the fleet's gRPC
// channel refuses them). Checks: errors are INVALID_ARGUMENT with bounded messages; a decoded
// entry encodes to bytes that decode and encode again to the same bytes (nothing is lost or
// invented on a relay); ValidatePlan gives one status per matrix, each OK or INVALID_ARGUMENT.
#include <cstdint>
#include <string>
#include <vector>

#include "server/distributed/batch.h"
#include "server/fleet/wire/entry_checks.h"
#include "server/fleet/wire/fleet_codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;  // NOLINT
  fleet::v1::LogEntry proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::StatusOr<LogEntry> entry = LogEntryFromProto(proto);
  FUZZ_CHECK_ERROR(entry.status(), absl::StatusCode::kInvalidArgument);
  if (!entry.ok()) return 0;

  const std::string encoded = LogEntryToProto(*entry).SerializeAsString();
  fleet::v1::LogEntry again;
  FUZZ_CHECK(again.ParseFromString(encoded));
  const absl::StatusOr<LogEntry> back = LogEntryFromProto(again);
  FUZZ_CHECK(back.ok()) << "an entry this rank encoded does not decode: " << back.status();
  FUZZ_CHECK(LogEntryToProto(*back).SerializeAsString() == encoded) << "the entry changed on a relay";

  const absl::Status shape = CheckBatchShape(*entry);
  FUZZ_CHECK_ERROR(shape, absl::StatusCode::kInvalidArgument);
  if (!shape.ok()) {
    const LogEntry failure = UnusableBatch(*entry, shape);
    FUZZ_CHECK(failure.status.code() == absl::StatusCode::kInternal) << failure.status;
    return 0;
  }
  if (entry->membership() || !entry->status.ok()) return 0;
  const std::vector<absl::Status> verdicts = ValidatePlan(entry->plan);
  FUZZ_CHECK(verdicts.size() == entry->plan.matrices.size()) << verdicts.size();
  for (const absl::Status& s : verdicts) FUZZ_CHECK_ERROR(s, absl::StatusCode::kInvalidArgument);
  return 0;
}
