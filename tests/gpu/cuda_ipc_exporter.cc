// The other process of cuda_ipc_gpu_test (a real GPU): allocates `bytes` bytes on device 0, fills
// the first `elements` floats with Gaussian values from `seed` (std::mt19937, as the test draws
// them) and the rest with zeros, exports the allocation and prints one line,
//   <device-uuid> <cudaIpcMemHandle_t as 128 hex digits>
// then keeps the allocation until its stdin closes, and frees it. Exit status 1 on a CUDA error.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

int Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  std::fprintf(stderr, "cuda_ipc_exporter: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s BYTES ELEMENTS SEED\n", argv[0]);
    return 2;
  }
  const size_t bytes = std::strtoull(argv[1], nullptr, 10);
  const size_t elements = std::strtoull(argv[2], nullptr, 10);
  const unsigned seed = static_cast<unsigned>(std::strtoul(argv[3], nullptr, 10));
  if (elements * sizeof(float) > bytes) return 2;
  Check(cudaSetDevice(0), "cudaSetDevice");
  void* p = nullptr;
  Check(cudaMalloc(&p, bytes), "cudaMalloc");
  Check(cudaMemset(p, 0, bytes), "cudaMemset");
  std::vector<float> values(elements);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (float& v : values) v = dist(rng);
  Check(cudaMemcpy(p, values.data(), elements * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaIpcMemHandle_t handle;
  Check(cudaIpcGetMemHandle(&handle, p), "cudaIpcGetMemHandle");
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x ", u[0], u[1], u[2], u[3], u[4],
              u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  const auto* h = reinterpret_cast<const unsigned char*>(&handle);
  for (size_t i = 0; i < sizeof(handle); ++i) std::printf("%02x", h[i]);
  std::printf("\n");
  std::fflush(stdout);
  char buffer[64];
  while (std::fread(buffer, 1, sizeof(buffer), stdin) > 0) {
  }
  Check(cudaFree(p), "cudaFree");
  return 0;
}
