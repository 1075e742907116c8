// Host emulation of cuBLASLt, of the CUDA event and error calls and of the mirror kernel, for the
// tests that run the CUDA backend's code without a GPU (the test binaries link neither libcudart
// nor libcublasLt). The emulated cublasLtMatmul follows cuBLASLt's contract: D = alpha·op(A)·op(B)
// + beta·C per batch instance, formed in fp32 and rounded once to D's type, with every layout
// validated against the op flags and the problem; it also checks that the algorithm it is handed
// is the one the heuristic chose for a single instance, and, when `main` is set, the stream
// protocol: side streams only run strips after waiting on the fork event, and the mirror only
// runs once every side stream has been joined back.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace orthoserve::gpu_emulation {

// What the emulation saw.
struct Emulation {
  int64_t matmul_calls = 0;
  int64_t batched_calls = 0;        // Calls with a batch count > 1.
  bool refuse_batched = false;      // cublasLtMatmulAlgoCheck refuses strided batches.
  int64_t fail_call = 0;            // cublasLtMatmul call number (1-based) that fails; 0: none.
  int32_t split_k = 1;              // SPLITK_NUM of the algorithms the heuristic hands out.
  std::set<cudaStream_t> streams;   // Streams a product ran on.
  std::vector<std::string> errors;  // Contract violations.
  // Stream protocol.
  cudaStream_t main = nullptr;  // Null: the stream protocol is not checked.
  cudaEvent_t fork = nullptr;
  int64_t fork_epoch = 0;
  std::map<cudaStream_t, int64_t> waited_epoch;  // Fork epoch each side stream last waited on.
  std::map<cudaStream_t, bool> unjoined;         // Side stream forked and not yet joined back.
  std::map<cudaEvent_t, cudaStream_t> recorded;  // Event → stream it was last recorded on.
  int device_count = 0;                          // What cudaGetDeviceCount reports.
};
extern Emulation g;

}  // namespace orthoserve::gpu_emulation
