// Implementation of server/engine/cuda/cuda_ipc.h.
#include "server/engine/cuda/cuda_ipc.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"

namespace orthoserve {
namespace {

using cuda::CudaCall;

// cuMemGetAddressRange (v2): the base and size of the allocation holding a device pointer.
using AddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);

// The driver's cuMemGetAddressRange through the runtime (no link against libcuda, which a
// machine without a GPU driver lacks). INTERNAL when the runtime cannot give it.
absl::StatusOr<AddressRangeFn> AddressRange() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("the driver's cuMemGetAddressRange is not available (",
                                            cudaGetErrorName(error), "); CUDA IPC regions cannot be sized"));
  }
  return reinterpret_cast<AddressRangeFn>(fn);
}

// One opened handle; closes it when destroyed.
class Imported final : public ImportedDeviceMemory {
 public:
  Imported(int device, void* base) : device_(device), base_(base) {}
  ~Imported() override {
    // The device current on this (any) thread may be another one: set it, as for every call.
    cudaSetDevice(device_);
    const cudaError_t error = cudaIpcCloseMemHandle(base_);
    if (error != cudaSuccess) {
      cudaGetLastError();
      LOG_WARNING("shm") << "cudaIpcCloseMemHandle: " << cudaGetErrorName(error) << ": " << cudaGetErrorString(error);
    }
  }
  Imported(const Imported&) = delete;
  Imported& operator=(const Imported&) = delete;

  char* data() const override { return data_; }
  int64_t size() const override { return size_; }
  void Expose(char* data, int64_t size) {
    data_ = data;
    size_ = size;
  }

 private:
  const int device_;
  void* const base_;  // What cudaIpcOpenMemHandle returned (the allocation's base).
  char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace

std::string FormatGpuUuid(const unsigned char (&b)[16]) {
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                         b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

CudaIpcOpener::CudaIpcOpener(int device, std::string device_uuid)
    : device_(device), device_uuid_(std::move(device_uuid)) {}

absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> CudaIpcOpener::Open(const IpcOpenRequest& request) {
  if (request.handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC memory handle has ", kCudaIpcHandleBytes, " bytes, not ", request.handle.size()));
  }
  if (request.device_uuid != device_uuid_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the handle is of device ", request.device_uuid, ", but this server computes on device ", device_uuid_,
        " (its --device ", device_, "); hand it to the server of that GPU (ServerInfo.shm_cuda_device)"));
  }
  if (request.offset < 0 || request.offset % kCudaIpcRegionAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the region's offset in its allocation is ", request.offset,
                                                   "; it must be a non-negative multiple of ",
                                                   kCudaIpcRegionAlignment));
  }
  if (request.size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the region's size is ", request.size, "; it must be >= 1"));
  }
  RETURN_IF_ERROR(CudaCall(cudaSetDevice(device_), "cudaSetDevice"));
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == kCudaIpcHandleBytes, "cudaIpcMemHandle_t is not 64 bytes");
  std::memcpy(&handle, request.handle.data(), sizeof(handle));
  void* base = nullptr;
  // The lazy peer-access flag only lets a handle of another device map at all; its memory is
  // then refused below, so every region is memory of this server's own device.
  const cudaError_t opened = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    cudaGetLastError();  // Not sticky: the next call on this thread must not report it.
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA IPC handle cannot be opened (unknown, its allocation freed, its process gone, or a handle of "
        "the server's own process): cudaIpcOpenMemHandle: ",
        cudaGetErrorName(opened), ": ", cudaGetErrorString(opened)));
  }
  auto imported = std::make_unique<Imported>(device_, base);  // Closes the handle on every error below.
  cudaPointerAttributes attributes;
  RETURN_IF_ERROR(CudaCall(cudaPointerGetAttributes(&attributes, base), "cudaPointerGetAttributes"));
  if (attributes.type != cudaMemoryTypeDevice || attributes.device != device_) {
    return absl::FailedPreconditionError(absl::StrCat("the handle's memory is on device ordinal ", attributes.device,
                                                      " of this server, not on its --device ", device_, " (",
                                                      device_uuid_, "); hand it to the server of that GPU"));
  }
  ASSIGN_OR_RETURN(AddressRangeFn range, AddressRange());
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  const CUresult ranged = range(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(base));
  const auto base_address = reinterpret_cast<CUdeviceptr>(base);
  if (ranged != CUDA_SUCCESS || base_address < range_base || base_address - range_base > range_size) {
    return absl::InternalError(
        absl::StrCat("cuMemGetAddressRange of the opened handle failed (CUresult ", static_cast<int>(ranged), ")"));
  }
  // The allocation's bytes from the opened base on; offset + size is never formed.
  const auto allocation = static_cast<int64_t>(range_size - (base_address - range_base));
  if (request.offset > allocation || request.size > allocation - request.offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", request.offset, ", +", request.size,
                                              ") are not inside the handle's allocation of ", allocation, " bytes"));
  }
  imported->Expose(static_cast<char*>(base) + request.offset, request.size);
  return std::unique_ptr<ImportedDeviceMemory>(std::move(imported));
}

}  // namespace orthoserve
