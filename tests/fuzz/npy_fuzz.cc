// Fuzz target: orthoctl's .npy reader (ParseNpy, client/cpp/npy.h), which reads files an operator
// passes on the command line. Input: the file's bytes, read with and without void2_as_bf16.
// Checks: errors are INVALID_ARGUMENT with bounded messages; an accepted array has non-negative
// dims and exactly prod(shape) elements of its dtype, and EncodeNpy writes a file that parses
// back to the same array.
#include <cstdint>
#include <string>

#include "client/cpp/npy.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;          // NOLINT
  using namespace orthoserve::client;  // NOLINT
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool void2_as_bf16 : {false, true}) {
    NpyReadOptions options;
    options.void2_as_bf16 = void2_as_bf16;
    const absl::StatusOr<NpyArray> array = ParseNpy(bytes, options);
    FUZZ_CHECK_ERROR(array.status(), absl::StatusCode::kInvalidArgument);
    if (!array.ok()) continue;
    uint64_t bytes = ElementSize(array->dtype);
    for (int64_t d : array->shape) {
      FUZZ_CHECK(d >= 0) << d;
      FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) << "the shape's size overflows";
    }
    FUZZ_CHECK(array->data.size() == bytes) << array->data.size() << " bytes for a shape of " << bytes;
    const absl::StatusOr<std::string> encoded = EncodeNpy(*array);
    FUZZ_CHECK(encoded.ok()) << encoded.status();
    const absl::StatusOr<NpyArray> back = ParseNpy(*encoded, options);
    FUZZ_CHECK(back.ok()) << back.status();
    FUZZ_CHECK(back->dtype == array->dtype && back->shape == array->shape && back->data == array->data);
  }
  return 0;
}
