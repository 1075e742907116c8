// Helpers for the GPU tests: the device check every test skips on, an independent reference of
// the Newton–Schulz contract (float64, or the bf16-emulating MEDIUM loop) written for these
// tests, and packing between doubles and wire dtypes.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "server/engine/backend.h"

namespace orthoserve::gpu_testing {

// Number of CUDA devices cudaGetDeviceCount reports (0 when it fails: no driver, no device).
int CudaDeviceCount();

// Skips the current test when the machine has no CUDA device.
#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (::orthoserve::gpu_testing::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (false)

// Gaussian rows × cols matrix (row-major) with a fixed seed.
std::vector<double> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed);

// `values` narrowed to `dtype` as raw bytes, and back.
std::vector<char> Pack(const std::vector<double>& values, DType dtype);
std::vector<double> Unpack(const std::vector<char>& bytes, DType dtype);
// What a backend sees when `values` are sent as `dtype`.
inline std::vector<double> AsSeen(const std::vector<double>& values, DType dtype) {
  return Unpack(Pack(values, dtype), dtype);
}

// ‖a − b‖_F / ‖b‖_F.
double RelativeError(const std::vector<double>& a, const std::vector<double>& b);

// scale · NS(g) of a row-major rows × cols matrix for fully resolved kernel arguments.
// medium = false: every operation in float64. medium = true: the MEDIUM contract emulated on
// the CPU — X = bf16(fp32(g) / fp32(d)), A = bf16(X·Xᵀ), B = bf16(b·A + c·A·A),
// X = bf16(a·X + B·X) (c = 0: bf16(a·X + b·A·X)), products accumulated in double.
std::vector<double> ReferenceNs(const std::vector<double>& g, int64_t rows, int64_t cols, const NsKernelArgs& args,
                                bool medium);

// Runs one matrix through Orthogonalize (server/engine/newton_schulz.h).
struct NsResult {
  absl::Status status;
  std::vector<char> bytes;     // Output in out_dtype.
  std::vector<double> values;  // Output widened.
};
NsResult RunOne(Backend& backend, const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
                DType in_dtype = DType::kF32, DType out_dtype = DType::kF32);

// The reference for what RunOne computes (input as seen in in_dtype).
std::vector<double> ReferenceFor(const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
                                 DType in_dtype = DType::kF32);

}  // namespace orthoserve::gpu_testing
