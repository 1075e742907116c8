// Internal to server/distributed: the SumReducer that TP_DISTRIBUTED hands to the engine, over
// Collective::AllReduceSum, with an agreement protocol so that a fleet rank that stops a sharded
// NS early (a bad local block, a backend error) never leaves its peers blocked in a reduction.
//
// Protocol. Every reduction is preceded by a header all-reduce of four doubles: (still running,
// float count, double count, failed). A running rank posts (1, n, 0, 0) or (1, 0, n, 0); the
// payload reduction follows only when every rank is running and the counts agree. Otherwise the
// running ranks return ABORTED from the reducer (the engine abandons the task) and all ranks
// move to Finish, which keeps posting (0, 0, 0, failed) until the sum says nobody is running;
// that final header tells every rank whether any rank failed. Headers cost one small extra
// all-reduce per reduction, bounded by the NS steps (about steps + 2 per matrix).
#pragma once

#include <array>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/distributed/batch_context.h"
#include "server/engine/backend.h"

namespace orthoserve::distributed_internal {

class GuardedReducer : public SumReducer {
 public:
  // `what` names the matrix in messages. Not thread-safe (one sharded task at a time).
  GuardedReducer(BatchContext& ctx, std::string what) : ctx_(ctx), what_(std::move(what)) {}

  absl::Status AllReduceSum(absl::Span<float> values) override;
  absl::Status AllReduceSum(absl::Span<double> values) override;
  // The payload goes to the collective as it is: device memory when the collective takes it.
  bool ReducesDeviceMemory() const override { return ctx_.collective().ReducesDeviceMemory(); }

  // Call once after the sharded NS has returned on this rank (or was not started), `failed_here`
  // telling whether it failed. Returns a collective error, or OK with `*any_failed` set when any
  // rank failed the matrix.
  absl::Status Finish(bool failed_here, bool* any_failed);

  // The collective error that broke a reduction (the batch then fails), or OK.
  const absl::Status& collective_error() const { return collective_error_; }
  // Whether this rank abandoned the task because a peer stopped (its failure is secondary).
  bool stopped_by_peer() const { return stopped_by_peer_; }

 private:
  absl::Status Header(const std::array<double, 4>& mine, std::array<double, 4>* sum);
  template <typename T>
  absl::Status Reduce(absl::Span<T> values, bool is_double);

  BatchContext& ctx_;
  const std::string what_;
  absl::Status collective_error_;
  bool stopped_by_peer_ = false;
};

}  // namespace orthoserve::distributed_internal
