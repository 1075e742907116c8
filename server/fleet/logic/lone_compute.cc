// Implementation of server/fleet/logic/lone_compute.h.
#include "server/fleet/logic/lone_compute.h"

#include "server/distributed/local_batch.h"

namespace orthoserve {

LoneComputation ComputeLoneMatrix(const MatrixPlan& plan, const Block& block, const void* in, void* out,
                                  Backend& backend, Metrics* metrics, const std::string& tenant, MemorySpace in_space,
                                  MemorySpace out_space) {
  absl::StatusOr<BatchResult> result = RunLocalBatch({LocalMatrix{plan, block, in, out, in_space, out_space}}, backend);
  LoneComputation c;
  if (!result.ok()) {
    c.status = result.status();
    return c;
  }
  c.status = result->matrices[0];
  c.compute_time = result->compute_time;
  c.flops = result->flops;
  if (metrics != nullptr) {
    metrics->StageTime(Stage::kCompute, c.compute_time);
    metrics->TenantCompute(tenant, c.compute_time);
    metrics->Flops(c.flops);
  }
  return c;
}

}  // namespace orthoserve
