// Fuzz target: one OrthogonalizeStream request message as the server reads it
// (server/rpc/stream_codec.h), and what the stream does with it: a StepHeader through
// StepRequestFromHeader, a MatrixSpec through ParseMatrixSpec (lone and group), a DataChunk read in
// place. Input: one byte, the size of the slices gRPC hands the message over in (0: one slice),
// then the message's bytes. Checks: the in-place read means what protobuf parses (the same verdict;
// for a chunk the same index and bytes, for anything else the same message); an accepted header
// meets every bound StepRequestFromHeader names; specs as spec_checks.h; a chunk echoed back
// (ChunkResponse) is byte for byte protobuf's serialization; errors have their documented codes and
// bounded messages.
#include <cstdint>
#include <string>

#include "server/rpc/stream_codec.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/sliced_buffer.h"
#include "tests/fuzz/spec_checks.h"

namespace orthoserve::fuzz {
namespace {

void CheckHeader(const v1::StepHeader& header, const ServiceOptions& options) {
  const absl::StatusOr<StepRequest> step = StepRequestFromHeader(header, "tenant", options);
  FUZZ_CHECK_ERROR(step.status(), absl::StatusCode::kInvalidArgument);
  if (!step.ok()) return;
  FUZZ_CHECK(step->world >= 1 && step->world <= options.max_group_world) << step->world;
  FUZZ_CHECK(step->rank >= 0 && step->rank < step->world) << step->rank;
  FUZZ_CHECK(step->step >= 0 && step->attempt >= 0);
  FUZZ_CHECK(step->num_matrices >= 1 && step->num_matrices <= options.max_matrices_per_step) << step->num_matrices;
  FUZZ_CHECK(step->job.size() <= static_cast<size_t>(options.max_name_bytes));
  FUZZ_CHECK(step->group.size() <= static_cast<size_t>(options.max_name_bytes));
  FUZZ_CHECK(step->run.size() <= static_cast<size_t>(options.max_name_bytes));
  if (step->world > 1) {
    FUZZ_CHECK(!step->job.empty());
    FUZZ_CHECK(!step->run.empty() || options.allow_group_steps_without_run_id);
  }
  FUZZ_CHECK(header.result_chunk_bytes() >= 0);
  const int64_t chunk = ResultChunkBytes(header.result_chunk_bytes(), options.chunk_bytes);
  FUZZ_CHECK(chunk > 0 && chunk <= options.chunk_bytes) << chunk;
}

}  // namespace
}  // namespace orthoserve::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;         // NOLINT
  using namespace orthoserve::fuzz;  // NOLINT
  if (size < 1) return 0;
  const size_t slice = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  StreamRequestView view;
  view.raw = SlicedBuffer(bytes, slice);
  const absl::Status parsed = ParseStreamRequest(&view);
  FUZZ_CHECK_ERROR(parsed, absl::StatusCode::kInvalidArgument);
  v1::StreamRequest expected;
  const bool protobuf_ok = expected.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  FUZZ_CHECK(parsed.ok() == protobuf_ok) << "ParseStreamRequest says " << parsed << ", protobuf "
                                         << (protobuf_ok ? "parses" : "does not parse") << " the message";
  if (!parsed.ok()) return 0;
  const v1::StreamRequest& m = view.message;
  FUZZ_CHECK(m.kind_case() == expected.kind_case()) << m.kind_case() << " vs " << expected.kind_case();
  if (m.has_chunk()) {
    FUZZ_CHECK(m.chunk().index() == expected.chunk().index()) << m.chunk().index() << " vs " << expected.chunk().index();
    FUZZ_CHECK(Joined(view.chunk_data) == expected.chunk().data());
    // The chunk echoed back as the server writes results: protobuf's bytes.
    v1::StreamResponse response;
    response.mutable_chunk()->set_index(expected.chunk().index());
    response.mutable_chunk()->set_data(expected.chunk().data());
    FUZZ_CHECK(Flatten(ChunkResponse(expected.chunk().index(), expected.chunk().data(), nullptr)) ==
               response.SerializeAsString());
    return 0;
  }
  FUZZ_CHECK(view.chunk_data.empty());
  // The same bytes (not MessageDifferencer, for which a NaN differs from itself).
  FUZZ_CHECK(m.SerializeAsString() == expected.SerializeAsString())
      << m.ShortDebugString().substr(0, 500) << " vs " << expected.ShortDebugString().substr(0, 500);

  const ServiceOptions options;
  if (m.has_header()) {
    const absl::Status limits = CheckHeaderLimits(m.header(), options);
    FUZZ_CHECK_ERROR(limits, absl::StatusCode::kInvalidArgument);
    CheckHeader(m.header(), options);
    ServiceOptions lenient;
    lenient.allow_group_steps_without_run_id = true;
    CheckHeader(m.header(), lenient);
  } else if (m.has_spec()) {
    CheckSpecVerdict(m.spec(), SpecLimitsOf(options), /*whole_if_unset=*/true);
    CheckSpecVerdict(m.spec(), SpecLimitsOf(options), /*whole_if_unset=*/false);
  }
  return 0;
}
