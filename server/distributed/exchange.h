// Internal to server/distributed: the owner scheme shared by AUTO and ROW_SHARDED — every block
// of a set of matrices travels to its matrix's owner (one all-to-allv), the owner runs NS on the
// assembled matrix, and the result blocks travel back (one all-to-allv).
//
// Packing. Segment p of a rank's send buffer holds, for each matrix of the set in set order
// whose owner is p, the blocks of that matrix placed on this rank in trainer-rank order, each
// block dense row-major in the matrix dtype. Every byte count is a function of the plan alone,
// so both ends compute the same sizes without a size exchange. Results come back in the
// mirrored layout in the result dtype. An owner's own blocks do not travel: it assembles them
// from (and writes results to) the caller's buffers, and when one of its local blocks is the
// whole matrix and blocks stay in host memory, NS runs on the caller's buffers with no copy at
// all (a lone client's path). A block this rank cannot read (its matrix already failed here)
// travels as zeros, so the byte counts still agree; the status exchange at the end of the batch
// tells every rank that the matrix failed.
//
// Memory. Send, receive and assembled buffers are in the batch's memory (BatchContext::memory()):
// on a GPU rank whose collective moves device memory (NCCL) every block goes up once (into the
// send buffer, or into its owner's assembled matrix), travels and is assembled device to device,
// and its result comes down once, into the caller's buffer.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/distributed/batch_context.h"

namespace orthoserve::distributed_internal {

struct OwnedMatrix {
  int matrix = 0;  // Index into the plan; must be valid (ValidatePlan OK) on every rank.
  int owner = 0;   // The fleet rank that assembles and computes it.
};

// Runs the owner scheme for `set` (identical on every rank). `phase` names the step in
// collective error messages. Returns only collective errors (the batch then fails); NS errors
// are recorded per matrix in `ctx`.
absl::Status AssembleOnOwners(BatchContext& ctx, absl::Span<const OwnedMatrix> set, const std::string& phase);

}  // namespace orthoserve::distributed_internal
