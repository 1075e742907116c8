// Implementation of guarded_reducer.h.
#include "server/distributed/guarded_reducer.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace orthoserve::distributed_internal {

absl::Status GuardedReducer::Header(const std::array<double, 4>& mine, std::array<double, 4>* sum) {
  *sum = mine;
  absl::Status status = ctx_.Collect(absl::StrCat(what_, " tp_distributed all-reduce (header)"), [&] {
    return ctx_.collective().AllReduceSum(absl::MakeSpan(sum->data(), sum->size()), ctx_.timeout());
  });
  if (!status.ok()) collective_error_ = status;
  return status;
}

template <typename T>
absl::Status GuardedReducer::Reduce(absl::Span<T> values, bool is_double) {
  if (!collective_error_.ok()) return collective_error_;
  if (stopped_by_peer_) return absl::AbortedError(absl::StrCat(what_, ": the sharded NS was abandoned"));
  const double n = static_cast<double>(values.size());
  std::array<double, 4> sum;
  RETURN_IF_ERROR(Header({1, is_double ? 0 : n, is_double ? n : 0, 0}, &sum));
  const double world = ctx_.world();
  if (sum[0] != world) {
    stopped_by_peer_ = true;
    return absl::AbortedError(absl::StrCat(what_, ": another fleet rank stopped the tp_distributed NS"));
  }
  if (sum[1] != world * (is_double ? 0 : n) || sum[2] != world * (is_double ? n : 0)) {
    stopped_by_peer_ = true;
    return absl::InternalError(absl::StrCat(what_, ": fleet ranks disagree on the size of a tp_distributed reduction"));
  }
  absl::Status status = ctx_.Collect(absl::StrCat(what_, " tp_distributed all-reduce"),
                                     [&] { return ctx_.collective().AllReduceSum(values, ctx_.timeout()); });
  if (!status.ok()) collective_error_ = status;
  return status;
}

absl::Status GuardedReducer::AllReduceSum(absl::Span<float> values) { return Reduce(values, false); }
absl::Status GuardedReducer::AllReduceSum(absl::Span<double> values) { return Reduce(values, true); }

absl::Status GuardedReducer::Finish(bool failed_here, bool* any_failed) {
  if (!collective_error_.ok()) return collective_error_;
  // Every rank reaches here after at most one header in which some rank was not running, so
  // this loop ends after at most two rounds.
  while (true) {
    std::array<double, 4> sum;
    RETURN_IF_ERROR(Header({0, 0, 0, failed_here ? 1.0 : 0.0}, &sum));
    if (sum[0] == 0) {
      *any_failed = sum[3] > 0;
      return absl::OkStatus();
    }
  }
}

}  // namespace orthoserve::distributed_internal
