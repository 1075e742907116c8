// Implementation of tests/gpu/cuda_runtime_emulation.h.
#include "tests/gpu/cuda_runtime_emulation.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "server/engine/cuda/kernels.h"

namespace {

void* Allocate(size_t bytes) { return std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256)); }

std::atomic<int> g_stream_tokens{0};
cudaStream_t NewToken() { return reinterpret_cast<cudaStream_t>(new int(++g_stream_tokens)); }

// A live cudaMalloc allocation.
struct Allocation {
  size_t bytes = 0;
  int device = 0;       // The device current on the allocating thread.
  uint64_t serial = 0;  // Unique per allocation (a new one at the same address gets a new serial).
  int64_t opens = 0;    // cudaIpcOpenMemHandle calls on its handle not yet closed.
};

// Live cudaMalloc allocations (start → allocation): what counts as device memory.
std::mutex g_device_mu;
std::map<uintptr_t, Allocation> g_device;
uint64_t g_serial = 0;
int64_t g_freed_while_open = 0;
thread_local int t_device = 0;  // cudaSetDevice.

void AddDevice(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  g_device[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, t_device, ++g_serial, 0};
}
void RemoveDevice(void* p) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  auto it = g_device.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_device.end()) return;
  if (it->second.opens > 0) ++g_freed_while_open;
  g_device.erase(it);
}

// The allocation holding [a, a + bytes), or end(). Requires g_device_mu.
std::map<uintptr_t, Allocation>::iterator Holding(uintptr_t a, size_t bytes) {
  auto it = g_device.upper_bound(a);
  if (it == g_device.begin()) return g_device.end();
  --it;
  return a + bytes <= it->first + it->second.bytes ? it : g_device.end();
}

// An emulated cudaIpcMemHandle_t: this prefix, then the allocation's serial; zeros after.
constexpr char kHandleMagic[8] = {'O', 'S', 'E', 'M', 'U', 'I', 'P', 'C'};

// cuMemGetAddressRange (v2), as cudaGetDriverEntryPointByVersion hands it out.
CUresult EmulatedGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  auto it = Holding(static_cast<uintptr_t>(ptr), 1);
  if (it == g_device.end()) return CUDA_ERROR_NOT_FOUND;
  *base = static_cast<CUdeviceptr>(it->first);
  *size = it->second.bytes;
  return CUDA_SUCCESS;
}

// Element i of a `dtype` array, widened; element i of a `dtype` array, narrowed from v.
float LoadAt(orthoserve::DType dtype, const void* p, int64_t i) {
  float v;
  orthoserve::ConvertToF32(dtype, static_cast<const char*>(p) + i * orthoserve::ElementSize(dtype), 1, &v);
  return v;
}
void StoreAt(orthoserve::DType dtype, void* p, int64_t i, float v) {
  orthoserve::ConvertFromF32(dtype, &v, 1, static_cast<char*>(p) + i * orthoserve::ElementSize(dtype));
}

}  // namespace

namespace orthoserve::gpu_emulation {

bool IsDeviceMemory(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  return Holding(reinterpret_cast<uintptr_t>(p), bytes) != g_device.end();
}

int64_t OpenIpcHandles() {
  std::lock_guard<std::mutex> lock(g_device_mu);
  int64_t opens = 0;
  for (const auto& [base, allocation] : g_device) opens += allocation.opens;
  return opens;
}

int64_t FreedWhileOpen() {
  std::lock_guard<std::mutex> lock(g_device_mu);
  return g_freed_while_open;
}

}  // namespace orthoserve::gpu_emulation

extern "C" {
cudaError_t cudaSetDevice(int device) {
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "Emulated CUDA device", sizeof(prop->name) - 1);
  // A UUID per ordinal: e0e1e2...ef with the last byte the ordinal.
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = static_cast<char>(0xe0 + i);
  prop->uuid.bytes[15] = static_cast<char>(device);
  prop->totalGlobalMem = size_t{16} << 30;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  *total = size_t{16} << 30;
  *free = size_t{8} << 30;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = Allocate(bytes);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  AddDevice(*p, bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  RemoveDevice(p);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = Allocate(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = NewToken();
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<int*>(stream);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(NewToken());
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<int*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t) {
  for (size_t r = 0; r < height; ++r) {
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  std::memset(attr, 0, sizeof(*attr));
  std::lock_guard<std::mutex> lock(g_device_mu);
  auto it = Holding(reinterpret_cast<uintptr_t>(p), 1);
  attr->type = it != g_device.end() ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  attr->device = it != g_device.end() ? it->second.device : -1;
  attr->devicePointer = it != g_device.end() ? const_cast<void*>(p) : nullptr;
  return cudaSuccess;
}
// CUDA IPC: a handle names a live allocation (by its serial). Opening it returns the allocation's
// own address (device memory is host memory here, shared by the "processes" of a test) and counts
// the open, as the driver counts repeated opens in one context (the same pointer each time); the
// handle of an allocation that was freed, or bytes that are no handle, fail as the driver does.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  auto it = g_device.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_device.end()) return cudaErrorInvalidValue;  // Not the base of an allocation.
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, kHandleMagic, sizeof(kHandleMagic));
  std::memcpy(handle->reserved + sizeof(kHandleMagic), &it->second.serial, sizeof(uint64_t));
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned int) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  uint64_t serial = 0;
  std::memcpy(&serial, handle.reserved + sizeof(kHandleMagic), sizeof(serial));
  if (std::memcmp(handle.reserved, kHandleMagic, sizeof(kHandleMagic)) != 0) return cudaErrorMapBufferObjectFailed;
  for (auto& [base, allocation] : g_device) {
    if (allocation.serial != serial) continue;
    ++allocation.opens;
    *p = reinterpret_cast<void*>(base);
    return cudaSuccess;
  }
  return cudaErrorMapBufferObjectFailed;
}
cudaError_t cudaIpcCloseMemHandle(void* p) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  auto it = g_device.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_device.end() || it->second.opens == 0) return cudaErrorInvalidValue;
  --it->second.opens;
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  if (std::strcmp(symbol, "cuMemGetAddressRange") != 0) {
    *fn = nullptr;
    if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
  }
  *fn = reinterpret_cast<void*>(&EmulatedGetAddressRange);
  if (status != nullptr) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
// Graphs are not emulated: the tests run the backend without them (Options::cuda_graphs false).
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t*) { return cudaErrorNotSupported; }
cudaError_t cudaGraphInstantiate(cudaGraphExec_t*, cudaGraph_t, unsigned long long) { return cudaErrorNotSupported; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
}

// The kernels of server/engine/cuda/kernels.h, as their contracts there say.
namespace orthoserve::cuda {

int64_t SumSquaresScratch(int64_t n, int64_t batch) {
  return std::max<int64_t>(1, std::min<int64_t>(kSumSquaresMaxScratch, (n + 2047) / 2048)) * batch;
}

cudaError_t SumSquares(DType dtype, const void* x, int64_t n, int64_t batch, bool bf16_input, double* /*scratch*/,
                       double* result, cudaStream_t) {
  for (int64_t j = 0; j < batch; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float loaded = LoadAt(dtype, x, j * n + i);
      const double v = bf16_input ? RoundToBf16(loaded) : loaded;
      sum += v * v;
    }
    result[j] = sum;
  }
  return cudaSuccess;
}

cudaError_t Normalize(DType in_dtype, const void* in, int64_t n, int64_t batch, const double* sumsq, double eps,
                      bool add_eps, bool bf16, DType work, void* out, cudaStream_t) {
  for (int64_t j = 0; j < batch; ++j) {
    const double norm = std::sqrt(sumsq[j]);
    float d = static_cast<float>(add_eps ? norm + eps : std::fmax(norm, eps));
    if (bf16) {
      const float norm_b = RoundToBf16(static_cast<float>(norm));
      const float eps_b = RoundToBf16(static_cast<float>(eps));
      d = add_eps ? RoundToBf16(norm_b + eps_b) : std::fmax(norm_b, eps_b);
    }
    for (int64_t i = 0; i < n; ++i) {
      const float loaded = LoadAt(in_dtype, in, j * n + i);
      const float v = bf16 ? RoundToBf16(loaded) : loaded;
      StoreAt(work, out, j * n + i, d != 0.0f ? v / d : v);
    }
  }
  return cudaSuccess;
}

cudaError_t ScaleConvert(DType x_dtype, const void* x, int64_t n, float scale, DType out_dtype, void* out,
                         cudaStream_t) {
  // Read everything first: `out` may be `x` (in place) with a narrower type.
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = LoadAt(x_dtype, x, i) * scale;
  ConvertFromF32(out_dtype, values.data(), values.size(), out);
  return cudaSuccess;
}

cudaError_t AccumulateF32(DType src_dtype, const void* src, int64_t n, float* dst, bool first, cudaStream_t) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = LoadAt(src_dtype, src, i);
    dst[i] = first ? v : dst[i] + v;
  }
  return cudaSuccess;
}

cudaError_t SumInOrder(const double* v, int64_t n, double* out, cudaStream_t) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += v[i];
  *out = sum;
  return cudaSuccess;
}

cudaError_t FirstNonFinite(DType dtype, const void* x, int64_t n, unsigned long long* first, cudaStream_t) {
  for (int64_t i = 0; i < n && static_cast<unsigned long long>(i) < *first; ++i) {
    if (!std::isfinite(LoadAt(dtype, x, i))) {
      *first = static_cast<unsigned long long>(i);
      break;
    }
  }
  return cudaSuccess;
}

cudaError_t LaunchInvalidConfigForTest(cudaStream_t) { return cudaErrorInvalidConfiguration; }

}  // namespace orthoserve::cuda
