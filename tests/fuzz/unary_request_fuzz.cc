// Fuzz target: the body of an Orthogonalize (unary) call as the server parses it
// (server/rpc/unary_call.cc, UnaryCall::Run): ReadMatricesInPlace (proto/convert/chunk_wire.h) on
// the bytes cut into slices as gRPC may hand them over, then, for each matrix as Run does, its
// spec parsed by protobuf, CheckSpecLimits and ParseMatrixSpec for a lone client, and the whole-
// matrix rule. Input: one byte, the slice size (0: one slice), then the request's bytes. Checks:
// the in-place read means what protobuf parses (a request protobuf parses is read with the same
// matrices, specs and data; one it refuses is refused, or read with a spec that then fails to
// parse, which Run refuses); specs as spec_checks.h.
#include <cstdint>
#include <string>
#include <vector>

#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/convert/chunk_wire.h"
#include "server/rpc/region_slices.h"
#include "server/step/step.h"
#include "server/rpc/stream_codec.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/sliced_buffer.h"
#include "tests/fuzz/spec_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;         // NOLINT
  using namespace orthoserve::fuzz;  // NOLINT
  if (size < 1) return 0;
  const size_t slice = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  grpc::ByteBuffer buffer = SlicedBuffer(bytes, slice);
  std::vector<MatrixInPlace> matrices;
  std::string call_id;
  bool read;
  {
    grpc::ProtoBufferReader reader(&buffer);
    read = reader.status().ok() && ReadMatricesInPlace(&reader, &matrices, &call_id);
  }
  v1::OrthogonalizeRequest expected;
  const bool protobuf_ok = expected.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  if (protobuf_ok) {
    FUZZ_CHECK(read) << "protobuf parses the request, ReadMatricesInPlace does not";
    FUZZ_CHECK(matrices.size() == static_cast<size_t>(expected.matrices_size()))
        << matrices.size() << " vs " << expected.matrices_size();
    FUZZ_CHECK(call_id == expected.call_id());
  }
  if (!read) return 0;
  std::vector<v1::MatrixSpec> specs(matrices.size());
  bool every_spec_parses = true;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const MatrixInPlace& m = matrices[i];
    FUZZ_CHECK(static_cast<size_t>(m.data_bytes) == Joined(m.data).size()) << m.data_bytes;
    const bool spec_parses = specs[i].ParseFromString(m.spec);
    every_spec_parses = every_spec_parses && spec_parses;
    if (protobuf_ok) {
      const v1::Matrix& e = expected.matrices(static_cast<int>(i));
      FUZZ_CHECK(spec_parses) << "matrix " << i << ": protobuf parses its spec, MatrixSpec::ParseFromString does not";
      // The same bytes (not MessageDifferencer, for which a NaN differs from itself).
      FUZZ_CHECK(specs[i].SerializeAsString() == e.spec().SerializeAsString()) << "matrix " << i;
      FUZZ_CHECK(Joined(m.data) == e.data()) << "matrix " << i;
    }
  }
  FUZZ_CHECK(protobuf_ok || !every_spec_parses)
      << "ReadMatricesInPlace and every spec accept a request protobuf does not parse";
  if (!every_spec_parses) return 0;

  // As Run: the count, then each spec's limits, its parse for a lone client, whole matrices only.
  const ServiceOptions options;
  const SpecLimits limits = SpecLimitsOf(options);
  if (matrices.empty() || static_cast<int>(matrices.size()) > options.max_matrices_per_step) return 0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const v1::MatrixSpec& spec = specs[i];
    CheckSpecVerdict(spec, limits, /*whole_if_unset=*/true);
    const absl::StatusOr<ParsedSpec> p = ParseMatrixSpec(spec, static_cast<int>(i), limits, true);
    if (!p.ok()) return 0;
    if (!(p->block == WholeBlock(p->plan.view))) return 0;
    // The bytes admission counts for the call (Run sums them): never negative, never wrapped.
    FUZZ_CHECK(SpecMetadataBytes(spec) >= kMatrixOverheadBytes) << SpecMetadataBytes(spec);
    FUZZ_CHECK(ResultBytes(*p) >= 0 && p->block_bytes >= 0);
  }
  return 0;
}
