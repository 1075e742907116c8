// Internal to server/distributed: the per-algorithm phases ExecuteBatch runs, in this order, on
// every rank. Each phase takes the valid matrices of its algorithm (identical on every rank),
// makes its collective calls in an order that depends only on the plan, records per-matrix
// failures in the context, and returns a non-OK status only when a collective call failed or a
// buffer of the batch could not be allocated (the batch then fails and the collective is broken).
#pragma once

#include "absl/status/status.h"
#include "server/distributed/batch_context.h"

namespace orthoserve::distributed_internal {

// TP_BLOCKWISE: each local block alone, scaled by its own shape. No collective calls.
void RunTpBlockwise(BatchContext& ctx);

// AUTO: one owner round for the whole batch (two all-to-allv), owners from the plan.
absl::Status RunAuto(BatchContext& ctx);

// ROW_SHARDED: grouped by dtype (first appearance), numel descending (ties by plan order), rounds
// of world() matrices with fleet rank i owning the i-th; two all-to-allv per round.
absl::Status RunRowSharded(BatchContext& ctx);

// GATHERED and TP_DUPLICATED: all-gather whole matrices (one all-gatherv per group of matrices
// of bounded size, plan order), NS on every rank holding a non-empty block, each rank keeps its
// blocks.
absl::Status RunGathered(BatchContext& ctx);

// TP_DISTRIBUTED: one sharded NS per matrix in plan order over the whole fleet.
absl::Status RunTpDistributed(BatchContext& ctx);

// Makes every matrix's status identical on every rank: the first primary failure in fleet rank
// order wins (one all-gatherv of codes and message lengths, and one of the messages when any
// matrix failed). No collective calls for a world of 1.
absl::Status ExchangeStatuses(BatchContext& ctx);

}  // namespace orthoserve::distributed_internal
