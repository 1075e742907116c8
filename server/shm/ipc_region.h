// CUDA IPC regions (docs/shared_memory.md): what the handover socket's CUDA_IPC message names,
// opened by a backend's IpcOpener (server/engine/ipc_memory.h) as a region's memory. No gRPC, no
// CUDA header: the opener is the CUDA backend's.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/ipc_memory.h"
#include "server/shm/cuda_ipc_message.h"
#include "server/shm/region_memory.h"

namespace orthoserve {

// Opens `handover` with `opener` (not owned; outlives the returned memory, which closes the
// handle when destroyed). The opener's errors (IpcOpener::Open).
absl::StatusOr<std::unique_ptr<RegionMemory>> OpenCudaIpcRegion(IpcOpener& opener, const CudaIpcHandover& handover);

// HandoverSocket::Options::open_cuda_ipc for a backend's opener; empty for null (a cpu
// backend: the socket then refuses CUDA IPC messages).
std::function<absl::StatusOr<std::unique_ptr<RegionMemory>>(const CudaIpcHandover&)> CudaIpcOpenFunction(
    IpcOpener* opener);

}  // namespace orthoserve
