// CudaIpcOpener: the CUDA backend's IpcOpener (server/engine/ipc_memory.h) — other processes'
// allocations opened with cudaIpcOpenMemHandle on the backend's device, checked against the
// device and the allocation's real extent (cuMemGetAddressRange, reached through the runtime's
// driver entry points so that nothing links libcuda), and closed with cudaIpcCloseMemHandle when
// the last user lets go. Internal to server/engine/cuda.
#pragma once

#include <memory>
#include <string>

#include "server/engine/ipc_memory.h"

namespace orthoserve {

class CudaIpcOpener final : public IpcOpener {
 public:
  // Opens on device ordinal `device` of this process, whose UUID is `device_uuid`.
  CudaIpcOpener(int device, std::string device_uuid);

  std::string device_uuid() const override { return device_uuid_; }
  absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> Open(const IpcOpenRequest& request) override;

 private:
  const int device_;
  const std::string device_uuid_;
};

// A device's UUID as nvidia-smi prints it: "GPU-" and 16 bytes as 8-4-4-4-12 lowercase hex digits.
std::string FormatGpuUuid(const unsigned char (&bytes)[16]);

}  // namespace orthoserve
