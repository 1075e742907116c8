// Fuzz target: a ready report as the coordinator reads it from a member
// (ReadyReportFromProto, server/fleet/wire/fleet_codec.h, through a SpecListCache as the fleet
// service decodes them). Input: a serialized orthoserve.fleet.v1.ReadyReport (inputs protobuf
// does not parse are skipped: the fleet's gRPC channel refuses them). Checks: errors are
// INVALID_ARGUMENT with bounded messages, the same with the cache as without; a decoded report
// has one block per spec and a trainer world within kMaxFleetTrainerWorld; it encodes to bytes
// that decode and encode again to the same bytes; its region slices go through the overlap check
// (FirstWriteOverlap) without a fault; decoded twice through one cache, the second is
// the same shared list.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "common/shared_span.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/wire/spec_list_cache.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;  // NOLINT
  fleet::v1::ReadyReport proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  SpecListCache cache(2);
  const absl::StatusOr<ReadyReport> cached = ReadyReportFromProto(proto, &cache);
  const absl::StatusOr<ReadyReport> report = ReadyReportFromProto(proto);
  FUZZ_CHECK_ERROR(report.status(), absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK(cached.status() == report.status()) << cached.status() << " vs " << report.status();
  if (!report.ok()) return 0;

  FUZZ_CHECK(report->sent.blocks.size() == report->sent.specs->size())
      << report->sent.blocks.size() << " blocks for " << report->sent.specs->size() << " specs";
  FUZZ_CHECK(report->trainer_world <= kMaxFleetTrainerWorld) << report->trainer_world;
  const absl::StatusOr<ReadyReport> again = ReadyReportFromProto(proto, &cache);
  FUZZ_CHECK(again.ok() && again->sent.specs == cached->sent.specs) << "the cache decoded the same list twice";

  // The coordinator's check across the ranks' slices (Rendezvous), here on this rank's.
  const std::optional<std::pair<size_t, size_t>> overlap = FirstWriteOverlap(report->region_spans);
  if (overlap) {
    FUZZ_CHECK(overlap->first < overlap->second && overlap->second < report->region_spans.size());
  }

  const std::string encoded = ReadyReportToProto(*report).SerializeAsString();
  fleet::v1::ReadyReport reparsed;
  FUZZ_CHECK(reparsed.ParseFromString(encoded));
  const absl::StatusOr<ReadyReport> back = ReadyReportFromProto(reparsed);
  FUZZ_CHECK(back.ok()) << "a report this rank encoded does not decode: " << back.status();
  FUZZ_CHECK(ReadyReportToProto(*back).SerializeAsString() == encoded) << "the report changed on a relay";
  return 0;
}
