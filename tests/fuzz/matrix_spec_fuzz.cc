// Fuzz target: one public MatrixSpec (a client's description of a matrix, sent on a stream or in
// a unary request) through the public ingress, ParseMatrixSpec (server/rpc/spec_codec.h), as a
// lone client's spec and as a group member's, under the default limits and under small ones.
// Input: the MatrixSpec's bytes (inputs protobuf does not parse are skipped: gRPC refuses them
// before the server sees them). Checks: spec_checks.h.
#include <cstdint>

#include "orthoserve/v1/orthogonalizer.pb.h"
#include "tests/fuzz/spec_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;  // NOLINT
  v1::MatrixSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  const SpecLimits defaults;
  const SpecLimits small{int64_t{1} << 12, 8, 3};
  for (const SpecLimits& limits : {defaults, small}) {
    fuzz::CheckSpecVerdict(spec, limits, /*whole_if_unset=*/true);
    fuzz::CheckSpecVerdict(spec, limits, /*whole_if_unset=*/false);
  }
  return 0;
}
