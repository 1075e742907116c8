// Builds the Backend a server runs on, by name.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"

namespace orthoserve {

struct BackendOptions {
  std::string kind = "cpu";            // "cpu" or "cuda".
  int cpu_threads = 1;                 // BLAS threads per matrix (cpu).
  int device = 0;                      // GPU ordinal (cuda).
  int64_t device_memory_budget = 0;    // Bytes of device memory the pools may hold; 0 = 90% of free (cuda).
  bool cuda_graphs = false;            // Replay each NS step loop as a CUDA graph (cuda).
};

// INVALID_ARGUMENT for an unknown kind or bad option; FAILED_PRECONDITION for "cuda" in a build
// without CUDA or on a machine without a usable device (the message says which).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace orthoserve
