// GPU memory of another process, opened from a CUDA IPC memory handle (docs/shared_memory.md,
// "CUDA IPC regions"): what a backend with a device offers the shared-memory registry, so that
// nothing outside server/engine/cuda includes a CUDA header. The cpu backend has none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace orthoserve {

// Bytes of a cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;
// A region opened from a handle must start at a multiple of this many bytes of its allocation
// (cudaMalloc aligns allocations to 256 bytes; the engine reads elements through typed pointers).
inline constexpr int64_t kCudaIpcRegionAlignment = 256;

// What a client hands over to make part of one of its allocations a region.
struct IpcOpenRequest {
  std::string handle;       // kCudaIpcHandleBytes bytes of cudaIpcMemHandle_t (of the allocation's base).
  std::string device_uuid;  // The exporter's device, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
  int64_t offset = 0;       // Where the region starts in the allocation (a multiple of kCudaIpcRegionAlignment).
  int64_t size = 0;         // Bytes of the region (> 0).
};

// One opened handle: bytes [data(), data() + size()) of the exporter's allocation, mapped into
// this process on the backend's device (its memory() space kDevice) until this object is
// destroyed, which closes the handle (cudaIpcCloseMemHandle). Destroy it only when no device work
// that uses the memory is in flight. Thread-compatible; may be destroyed on any thread.
class ImportedDeviceMemory {
 public:
  virtual ~ImportedDeviceMemory() = default;
  virtual char* data() const = 0;
  virtual int64_t size() const = 0;
};

// Opens CUDA IPC memory handles on one backend's device. Thread-safe.
class IpcOpener {
 public:
  virtual ~IpcOpener() = default;

  // The UUID of the device this opener maps memory onto ("GPU-..." as nvidia-smi prints it):
  // device ordinals differ between processes (CUDA_VISIBLE_DEVICES), UUIDs do not.
  virtual std::string device_uuid() const = 0;

  // Opens `request`. Errors: INVALID_ARGUMENT for a handle that is not kCudaIpcHandleBytes long, a
  // negative or misaligned offset, a size < 1, or a handle the driver cannot open (unknown, of an
  // allocation that was freed, of this process); FAILED_PRECONDITION when the request's
  // device_uuid is not device_uuid(), or the handle's memory turns out to be on another device;
  // OUT_OF_RANGE when [offset, offset + size) is not inside the handle's allocation (checked
  // without overflow); INTERNAL for other driver failures. Nothing stays open on an error.
  virtual absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> Open(const IpcOpenRequest& request) = 0;
};

}  // namespace orthoserve
