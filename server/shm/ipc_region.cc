// Implementation of server/shm/ipc_region.h.
#include "server/shm/ipc_region.h"

#include <string>
#include <utility>

namespace orthoserve {
namespace {

// A region's memory that is another process's GPU allocation, opened on the backend's device.
class IpcRegion final : public RegionMemory {
 public:
  IpcRegion(std::unique_ptr<ImportedDeviceMemory> memory, std::string device)
      : memory_(std::move(memory)), device_(std::move(device)) {}
  char* data() const override { return memory_->data(); }
  int64_t size() const override { return memory_->size(); }
  std::string cuda_device() const override { return device_; }

 private:
  const std::unique_ptr<ImportedDeviceMemory> memory_;  // Closes the handle when destroyed.
  const std::string device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RegionMemory>> OpenCudaIpcRegion(IpcOpener& opener, const CudaIpcHandover& handover) {
  IpcOpenRequest request;
  request.handle = handover.handle;
  request.device_uuid = handover.device_uuid;
  request.offset = handover.offset;
  request.size = handover.size;
  absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> memory = opener.Open(request);
  if (!memory.ok()) return memory.status();
  return std::unique_ptr<RegionMemory>(new IpcRegion(*std::move(memory), opener.device_uuid()));
}

std::function<absl::StatusOr<std::unique_ptr<RegionMemory>>(const CudaIpcHandover&)> CudaIpcOpenFunction(
    IpcOpener* opener) {
  if (opener == nullptr) return nullptr;
  return [opener](const CudaIpcHandover& handover) { return OpenCudaIpcRegion(*opener, handover); };
}

}  // namespace orthoserve
