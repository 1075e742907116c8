// Implementation of server/distributed/local_batch.h.
#include "server/distributed/local_batch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"
#include "server/collective/local_collective.h"

namespace orthoserve {
namespace {

bool AnyOnDevice(const std::vector<LocalMatrix>& matrices) {
  for (const LocalMatrix& m : matrices) {
    if (m.in_space == MemorySpace::kDevice || m.out_space == MemorySpace::kDevice) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<BatchResult> RunLocalBatch(std::vector<LocalMatrix> matrices, Backend& backend) {
  const bool on_device = AnyOnDevice(matrices);
  Memory& memory = backend.memory();
  if (on_device && memory.space() != MemorySpace::kDevice) {
    return absl::FailedPreconditionError(absl::StrCat("a matrix is in device memory (a CUDA IPC region), but the ",
                                                      backend.Info().name, " backend computes in host memory"));
  }
  BatchPlan plan;
  plan.trainer_world = 1;
  plan.fleet_world = 1;
  std::vector<LocalBlock> local;
  // A device batch's host sides, staged in device memory: the input is copied up here, the
  // result down after the batch (each once).
  std::vector<MemoryBuffer> staged;
  std::vector<std::pair<size_t, MemoryBuffer*>> downloads;  // matrix, its staged result.
  staged.reserve(2 * matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    LocalMatrix& m = matrices[i];
    m.plan.blocks = {BlockPlacement{0, 0, m.block}};
    const void* in = m.in;
    void* out = m.out;
    if (on_device && m.in_space == MemorySpace::kHost && in != nullptr) {
      const size_t bytes = static_cast<size_t>(m.block.numel()) * ElementSize(m.plan.dtype);
      const std::string what = absl::StrCat("matrix \"", BoundedText(m.plan.name), "\" input staged on the device");
      ASSIGN_OR_RETURN(MemoryBuffer buffer, memory.Allocate(bytes, false, what.c_str()));
      RETURN_IF_ERROR(memory.Copy(buffer.data(), MemorySpace::kDevice, in, MemorySpace::kHost, bytes));
      staged.push_back(std::move(buffer));
      in = staged.back().data();
    }
    if (on_device && m.out_space == MemorySpace::kHost && out != nullptr) {
      const size_t bytes = static_cast<size_t>(m.block.numel()) * ElementSize(m.plan.result_dtype);
      const std::string what = absl::StrCat("matrix \"", BoundedText(m.plan.name), "\" result staged on the device");
      ASSIGN_OR_RETURN(MemoryBuffer buffer, memory.Allocate(bytes, false, what.c_str()));
      staged.push_back(std::move(buffer));
      out = staged.back().data();
      downloads.emplace_back(i, &staged.back());
    }
    plan.matrices.push_back(std::move(m.plan));
    local.push_back(LocalBlock{static_cast<int>(i), 0, in, out, on_device ? MemorySpace::kDevice : MemorySpace::kHost});
  }
  AssignOwners(plan);
  if (!on_device) {
    LocalCollective collective;
    return ExecuteBatch(plan, local, backend, collective, ExecuteOptions{});
  }
  LocalCollective collective([&memory](void* dst, const void* src, size_t bytes) {
    return memory.Copy(dst, MemorySpace::kDevice, src, MemorySpace::kDevice, bytes);
  });
  ASSIGN_OR_RETURN(BatchResult result, ExecuteBatch(plan, local, backend, collective, ExecuteOptions{}));
  for (const auto& [i, buffer] : downloads) {
    if (!result.matrices[i].ok()) continue;
    absl::Status copied =
        memory.Copy(matrices[i].out, MemorySpace::kHost, buffer->data(), MemorySpace::kDevice, buffer->size());
    if (!copied.ok()) result.matrices[i] = Annotate(copied, "the result's download");
  }
  return result;
}

}  // namespace orthoserve
