// The memory a registered shared-memory region's slices point into (docs/shared_memory.md):
// host memory mapped from a memfd (MappedRegion), or GPU memory of another process opened from a
// CUDA IPC handle (server/engine/ipc_memory.h, adapted by the server). No gRPC, no CUDA.
#pragma once

#include <cstdint>
#include <string>

#include "common/shared_span.h"

namespace orthoserve {

// Owns the memory: destroying it unmaps (munmap) or closes (cudaIpcCloseMemHandle) it, which the
// registry does only once no lease holds it. Thread-compatible.
class RegionMemory {
 public:
  virtual ~RegionMemory() = default;
  virtual char* data() const = 0;
  virtual int64_t size() const = 0;
  // Empty: host memory this process reads and writes. Otherwise the UUID of the CUDA device that
  // holds the memory ("GPU-..."): only that device's backend may touch it, never host code.
  virtual std::string cuda_device() const { return ""; }
  // Which memory this is, as every process on this host names it (offset 0 is data()); the
  // default names memory only this process can: its address here.
  virtual MemoryId memory_id() const;
};

}  // namespace orthoserve
