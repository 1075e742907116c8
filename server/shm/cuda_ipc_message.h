// The handover socket's CUDA IPC message (docs/shared_memory.md, "CUDA IPC regions"): instead of
// a memfd, a client sends one line naming part of one of its GPU allocations,
//   CUDA_IPC <device-uuid> <offset> <size> <handle>\n
// with the device's UUID as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), the
// region's offset in the allocation and its size in decimal bytes, and the 64 bytes of its
// cudaIpcMemHandle_t as 128 hex digits — and no descriptor. The answer is the memfd's: one line,
// "OK <ticket>" or "ERR <CODE> <message>". No gRPC, no CUDA.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoserve {

// What a CUDA IPC message names.
struct CudaIpcHandover {
  std::string device_uuid;
  int64_t offset = 0;
  int64_t size = 0;
  std::string handle;  // 64 raw bytes.
};

// The first word of the message.
inline constexpr absl::string_view kCudaIpcMessagePrefix = "CUDA_IPC ";
// Bytes a message may have at most, newline included.
inline constexpr size_t kMaxCudaIpcMessageBytes = 512;

// Parses one message (with or without its newline). INVALID_ARGUMENT naming what is wrong: not
// five fields, a UUID that is not "GPU-" and 36 characters, a negative or non-decimal number, a
// handle that is not 128 hex digits.
absl::StatusOr<CudaIpcHandover> ParseCudaIpcMessage(absl::string_view line);

// The message for `handover`, newline included (clients and tests).
std::string FormatCudaIpcMessage(const CudaIpcHandover& handover);

}  // namespace orthoserve
