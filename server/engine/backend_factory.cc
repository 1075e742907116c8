// Implementation of server/engine/backend_factory.h.
#include "server/engine/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "server/engine/cpu/cpu_backend.h"
#if ORTHOSERVE_WITH_CUDA
#include "server/engine/cuda/cuda_backend.h"
#endif

namespace orthoserve {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.kind == "cpu") {
    CpuBackend::Options cpu;
    cpu.threads = options.cpu_threads;
    auto backend = CpuBackend::Create(cpu);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  }
  if (options.kind == "cuda") {
#if ORTHOSERVE_WITH_CUDA
    CudaBackend::Options cuda;
    cuda.device = options.device;
    cuda.memory_budget_bytes = options.device_memory_budget;
    cuda.cuda_graphs = options.cuda_graphs;
    auto backend = CudaBackend::Create(cuda);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
#else
    return absl::FailedPreconditionError(
        "--backend cuda: this build has no CUDA backend; rebuild with -DORTHOSERVE_WITH_CUDA=ON on a machine with the "
        "CUDA toolkit, or use --backend cpu");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend \"", options.kind, "\" is not one of cpu, cuda"));
}

}  // namespace orthoserve
