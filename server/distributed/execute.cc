// ExecuteBatch (batch.h): validates the plan, indexes this rank's blocks, runs the phases of
// algorithms.h in a fixed order and agrees on the per-matrix statuses.
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/distributed/algorithms.h"
#include "server/distributed/batch.h"
#include "server/distributed/batch_context.h"

namespace orthoserve {

using distributed_internal::BatchContext;

absl::StatusOr<BatchResult> ExecuteBatch(const BatchPlan& plan, absl::Span<const LocalBlock> local, Backend& backend,
                                         Collective& collective, const ExecuteOptions& options) {
  if (collective.world() != plan.fleet_world) {
    return absl::InvalidArgumentError(absl::StrCat("the plan is for a fleet of ", plan.fleet_world,
                                                   " ranks but the collective has ", collective.world()));
  }
  if (collective.rank() < 0 || collective.rank() >= collective.world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective rank ", collective.rank(), " outside a world of ", collective.world()));
  }
  std::vector<absl::Status> statuses = ValidatePlan(plan);
  // A plan whose AUTO owners were not chosen yet gets them here: the choice is a deterministic
  // function of the plan, so every rank makes the same one. The copy carries ValidatePlan's
  // verdict, so that the owners' cost estimate does not check the matrices again.
  const BatchPlan* effective = &plan;
  BatchPlan with_owners;
  for (const MatrixPlan& m : plan.matrices) {
    if (m.algorithm == Algorithm::kAuto && m.owner == -1) {
      with_owners = plan;
      for (size_t i = 0; i < statuses.size(); ++i) {
        if (statuses[i].ok()) with_owners.matrices[i].checked = true;
      }
      AssignOwners(with_owners);
      effective = &with_owners;
      break;
    }
  }

  // Owners chosen here are fleet ranks, which ValidatePlan accepts as it accepted -1.
  BatchContext ctx(*effective, std::move(statuses), local, backend, collective, options);
  // Phases in a fixed order; within each, collective calls depend only on the plan.
  distributed_internal::RunTpBlockwise(ctx);
  RETURN_IF_ERROR(distributed_internal::RunAuto(ctx));
  RETURN_IF_ERROR(distributed_internal::RunRowSharded(ctx));
  RETURN_IF_ERROR(distributed_internal::RunGathered(ctx));
  RETURN_IF_ERROR(distributed_internal::RunTpDistributed(ctx));
  RETURN_IF_ERROR(distributed_internal::ExchangeStatuses(ctx));

  BatchResult result = ctx.result();
  result.matrices = ctx.statuses();
  return result;
}

}  // namespace orthoserve
