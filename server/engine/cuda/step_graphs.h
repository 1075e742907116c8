// StepGraphs: CUDA graphs of the Newton–Schulz step loop, cached per context.
//
// Run either replays a cached graph (one launch for every GEMM and kernel of the loop) or, on a
// miss, runs `enqueue` directly the first time a key is seen (so that cuBLASLt plans and lazily
// loaded kernels exist before any capture) and, the second time, captures what it puts on
// `stream` (and on the side streams it forks and joins), instantiates it, caches it and launches
// it. The key must name everything the captured work
// depends on — buffer addresses, shapes, batch, precision, coefficients — since a graph replays
// the exact calls it captured. Steady-state training repeats the same shapes, and the memory
// pool hands back the same blocks for the same requests, so most calls hit. At most kCapacity
// graphs are kept; the least recently used is dropped. Thread-compatible (one per context).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "server/engine/cuda/cuda_handles.h"

namespace orthoserve::cuda {

class StepGraphs {
 public:
  using Key = std::vector<int64_t>;
  static constexpr size_t kCapacity = 32;

  // `enqueue` must only enqueue (no synchronization, no allocation). Its error is returned as
  // is, after the capture has been ended and discarded.
  absl::Status Run(const Key& key, cudaStream_t stream, absl::FunctionRef<absl::Status()> enqueue);

  size_t size() const { return graphs_.size(); }
  int64_t captures() const { return captures_; }

 private:
  struct Entry {
    GraphExec exec;
    uint64_t last_use = 0;
  };
  absl::flat_hash_map<Key, Entry> graphs_;
  absl::flat_hash_set<Key> seen_;  // Keys run once without a graph; cleared when it grows large.
  uint64_t clock_ = 0;
  int64_t captures_ = 0;
};

}  // namespace orthoserve::cuda
