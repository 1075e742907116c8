// Implementation of server/shm/cuda_ipc_message.h.
#include "server/shm/cuda_ipc_message.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace orthoserve {
namespace {

constexpr size_t kHandleBytes = 64;

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::StatusOr<int64_t> Decimal(absl::string_view field, const char* what) {
  int64_t value = 0;
  if (field.empty() || field.size() > 19 || !absl::ascii_isdigit(static_cast<unsigned char>(field[0])) ||
      !absl::SimpleAtoi(field, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA_IPC message: the ", what, " must be a non-negative decimal number of bytes"));
  }
  return value;
}

}  // namespace

absl::StatusOr<CudaIpcHandover> ParseCudaIpcMessage(absl::string_view line) {
  absl::ConsumeSuffix(&line, "\n");
  const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
  if (fields.size() != 5 || fields[0] != absl::StripSuffix(kCudaIpcMessagePrefix, " ")) {
    return absl::InvalidArgumentError(
        "a CUDA IPC message is one line: CUDA_IPC <device-uuid> <offset> <size> <handle as 128 hex digits>");
  }
  CudaIpcHandover h;
  const absl::string_view uuid = fields[1];
  if (uuid.size() != 40 || !absl::StartsWith(uuid, "GPU-")) {
    return absl::InvalidArgumentError(
        "CUDA_IPC message: the device must be its UUID as nvidia-smi prints it "
        "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
  }
  h.device_uuid = std::string(uuid);
  auto offset = Decimal(fields[2], "offset");
  if (!offset.ok()) return offset.status();
  auto size = Decimal(fields[3], "size");
  if (!size.ok()) return size.status();
  h.offset = *offset;
  h.size = *size;
  if (fields[4].size() != 2 * kHandleBytes || !IsHex(fields[4])) {
    return absl::InvalidArgumentError(
        "CUDA_IPC message: the handle must be the 64 bytes of a cudaIpcMemHandle_t "
        "as 128 hex digits");
  }
  h.handle = absl::HexStringToBytes(fields[4]);
  return h;
}

std::string FormatCudaIpcMessage(const CudaIpcHandover& h) {
  return absl::StrCat(kCudaIpcMessagePrefix, h.device_uuid, " ", h.offset, " ", h.size, " ",
                      absl::BytesToHexString(h.handle), "\n");
}

}  // namespace orthoserve
