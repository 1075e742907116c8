// Fuzz target: the hand-over socket's CUDA_IPC line (ParseCudaIpcMessage,
// server/shm/cuda_ipc_message.h), as a local process sends it. Input: the line's bytes, up to
// kMaxCudaIpcMessageBytes as the socket reads them. Checks: errors are INVALID_ARGUMENT with bounded
// messages; an accepted line names a "GPU-" UUID of 40 characters, a non-negative offset and size
// (the opener never adds them), and a 64-byte handle; formatted again it parses to the same.
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "server/shm/cuda_ipc_message.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;  // NOLINT
  if (size > kMaxCudaIpcMessageBytes) return 0;
  const absl::string_view line(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<CudaIpcHandover> parsed = ParseCudaIpcMessage(line);
  FUZZ_CHECK_ERROR(parsed.status(), absl::StatusCode::kInvalidArgument);
  if (!parsed.ok()) return 0;
  FUZZ_CHECK(absl::StartsWith(line, kCudaIpcMessagePrefix));
  FUZZ_CHECK(parsed->device_uuid.size() == 40 && absl::StartsWith(parsed->device_uuid, "GPU-"))
      << parsed->device_uuid;
  FUZZ_CHECK(parsed->offset >= 0 && parsed->size >= 0) << parsed->offset << " " << parsed->size;
  FUZZ_CHECK(parsed->handle.size() == 64) << parsed->handle.size();
  const std::string formatted = FormatCudaIpcMessage(*parsed);
  FUZZ_CHECK(formatted.size() <= kMaxCudaIpcMessageBytes) << formatted.size();
  const absl::StatusOr<CudaIpcHandover> back = ParseCudaIpcMessage(formatted);
  FUZZ_CHECK(back.ok()) << back.status();
  FUZZ_CHECK(back->device_uuid == parsed->device_uuid && back->offset == parsed->offset &&
             back->size == parsed->size && back->handle == parsed->handle);
  return 0;
}
