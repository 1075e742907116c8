// Implementation of server/engine/cuda/step_graphs.h.
#include "server/engine/cuda/step_graphs.h"

#include <utility>

#include "common/status.h"
#include "server/engine/cuda/cuda_status.h"

namespace orthoserve::cuda {

absl::Status StepGraphs::Run(const Key& key, cudaStream_t stream, absl::FunctionRef<absl::Status()> enqueue) {
  ++clock_;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    it->second.last_use = clock_;
    return CudaCall(cudaGraphLaunch(it->second.exec.get(), stream), "cudaGraphLaunch");
  }
  if (!seen_.contains(key)) {
    if (seen_.size() >= 8 * kCapacity) seen_.clear();
    seen_.insert(key);
    return enqueue();
  }
  // Thread-local mode: only this thread's unsafe calls are refused while capturing; other
  // callers of the backend keep allocating freely.
  RETURN_IF_ERROR(CudaCall(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"));
  const absl::Status enqueued = enqueue();
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &raw);
  Graph graph(raw);
  if (!enqueued.ok() || ended != cudaSuccess) {
    cudaGetLastError();  // The failed capture's error is returned here, not left for the next launch.
    RETURN_IF_ERROR(enqueued);
    return CudaCall(ended, "cudaStreamEndCapture");
  }
  cudaGraphExec_t raw_exec = nullptr;
  RETURN_IF_ERROR(CudaCall(cudaGraphInstantiate(&raw_exec, graph.get(), 0), "cudaGraphInstantiate"));
  GraphExec exec(raw_exec);
  ++captures_;
  if (graphs_.size() >= kCapacity) {
    auto oldest = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    graphs_.erase(oldest);
  }
  Entry& entry = graphs_[key];
  entry.exec = std::move(exec);
  entry.last_use = clock_;
  return CudaCall(cudaGraphLaunch(entry.exec.get(), stream), "cudaGraphLaunch");
}

}  // namespace orthoserve::cuda
