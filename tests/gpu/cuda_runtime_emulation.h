// Host emulation of the CUDA runtime calls and kernels the CUDA backend makes beyond the step
// loop's (tests/gpu/cublaslt_emulation.h has those): device memory is host memory (cudaMalloc
// records each allocation, so device pointers can be told from host ones), streams and events are
// tokens, every call runs at once on the calling thread (so stream order holds trivially), and
// CUDA graphs are refused. Linked with the backend's own sources instead of libcudart and
// kernels.cu, it lets CudaBackend run on machines without a GPU: its grouping, staging, pools and
// copies, with the arithmetic of the kernels written out on the host. It also emulates CUDA IPC
// memory handles (cudaIpcGetMemHandle / OpenMemHandle / CloseMemHandle) and the driver's
// cuMemGetAddressRange, so that regions of "another process's" GPU memory can be tested in one
// process, and gives each device ordinal its own UUID and each allocation its device. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace orthoserve::gpu_emulation {

// Whether [p, p + bytes) lies inside one live cudaMalloc allocation.
bool IsDeviceMemory(const void* p, size_t bytes);

// CUDA IPC handles opened (cudaIpcOpenMemHandle) and not closed yet, over all allocations.
int64_t OpenIpcHandles();
// Allocations cudaFree'd while a handle of theirs was still open (CUDA: undefined behaviour).
int64_t FreedWhileOpen();

}  // namespace orthoserve::gpu_emulation
