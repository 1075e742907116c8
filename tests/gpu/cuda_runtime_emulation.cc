// Implementation of tests/gpu/cuda_runtime_emulation.h.
#include "tests/gpu/cuda_runtime_emulation.h"

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

// Live cudaMalloc allocations (start → bytes): what counts as device memory.
std::mutex g_device_mu;
std::map<uintptr_t, size_t> g_device;

void AddDevice(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  g_device[reinterpret_cast<uintptr_t>(p)] = bytes;
}
void RemoveDevice(void* p) {
  std::lock_guard<std::mutex> lock(g_device_mu);
  g_device.erase(reinterpret_cast<uintptr_t>(p));
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
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_device_mu);
  auto it = g_device.upper_bound(a);
  if (it == g_device.begin()) return false;
  --it;
  return a + bytes <= it->first + it->second;
}

}  // namespace orthoserve::gpu_emulation

extern "C" {
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "Emulated CUDA device", sizeof(prop->name) - 1);
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
  attr->type = orthoserve::gpu_emulation::IsDeviceMemory(p, 1) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
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

cudaError_t SumSquares(DType dtype, const void* x, int64_t n, int64_t batch, double* /*scratch*/, double* result,
                       cudaStream_t) {
  for (int64_t j = 0; j < batch; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = LoadAt(dtype, x, j * n + i);
      sum += v * v;
    }
    result[j] = sum;
  }
  return cudaSuccess;
}

cudaError_t Normalize(DType in_dtype, const void* in, int64_t n, int64_t batch, const double* sumsq, double eps,
                      bool add_eps, DType work, void* out, cudaStream_t) {
  for (int64_t j = 0; j < batch; ++j) {
    const double norm = std::sqrt(sumsq[j]);
    const float d = static_cast<float>(add_eps ? norm + eps : std::fmax(norm, eps));
    for (int64_t i = 0; i < n; ++i) {
      const float v = LoadAt(in_dtype, in, j * n + i);
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

cudaError_t LaunchInvalidConfigForTest(cudaStream_t) { return cudaErrorInvalidConfiguration; }

}  // namespace orthoserve::cuda
