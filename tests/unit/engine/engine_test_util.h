// Helpers for the engine tests: packing matrices into wire dtypes, running one matrix through
// the engine entry point (Orthogonalize), and building the reference's arguments from options.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/ns_options.h"
#include "server/engine/backend.h"
#include "tests/unit/engine/reference_ns.h"

namespace orthoserve::testing {

inline constexpr double kHighestTolerance = 1e-5;  // vs the float64 reference, fp32 output.
inline constexpr double kMediumTolerance = 1e-2;   // vs the bf16-emulating reference.

// `values` narrowed to `dtype`, as raw little-endian bytes.
std::vector<char> Pack(const std::vector<double>& values, DType dtype);
// Raw `dtype` bytes widened to double.
std::vector<double> Unpack(const std::vector<char>& bytes, DType dtype);
// The values a backend sees for `values` sent as `dtype`.
std::vector<double> AsSeen(const std::vector<double>& values, DType dtype);

struct NsRun {
  absl::Status status;
  std::vector<char> bytes;     // The output in out_dtype.
  std::vector<double> values;  // The output widened.
};

// Orthogonalizes one rows × cols matrix through Orthogonalize(backend, ...).
NsRun RunNs(Backend& backend, const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
            DType in_dtype = DType::kF32, DType out_dtype = DType::kF32);

// The reference for `options` on g (as seen in `in_dtype`).
std::vector<double> Reference(const std::vector<double>& g, int64_t rows, int64_t cols, const NsOptions& options,
                              DType in_dtype = DType::kF32);

// The backend every test uses: a CpuBackend with `threads` threads, created once per count.
Backend& CpuBackendWithThreads(int threads);

}  // namespace orthoserve::testing
