// Implementation of server/collective/timed_collective.h.
#include "server/collective/timed_collective.h"

#include "absl/time/clock.h"

namespace orthoserve {

template <typename Call>
absl::Status TimedCollective::Timed(absl::string_view op, Call&& call) {
  const absl::Time start = absl::Now();
  absl::Status status = call();
  if (observer_) observer_(op, absl::Now() - start);
  return status;
}

absl::Status TimedCollective::AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                                        absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  return Timed(kCollectiveOpAllToAllv, [&] { return inner_->AllToAllv(send, send_bytes, recv, recv_bytes, timeout); });
}

absl::Status TimedCollective::AllGatherv(const void* send, size_t send_bytes, void* recv,
                                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  return Timed(kCollectiveOpAllGatherv,
               [&] { return inner_->AllGatherv(send, send_bytes, recv, recv_bytes, timeout); });
}

absl::Status TimedCollective::AllReduceSum(absl::Span<float> values, absl::Duration timeout) {
  return Timed(kCollectiveOpAllReduce, [&] { return inner_->AllReduceSum(values, timeout); });
}

absl::Status TimedCollective::AllReduceSum(absl::Span<double> values, absl::Duration timeout) {
  return Timed(kCollectiveOpAllReduce, [&] { return inner_->AllReduceSum(values, timeout); });
}

absl::Status TimedCollective::Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) {
  return Timed(kCollectiveOpBroadcast, [&] { return inner_->Broadcast(data, bytes, root, timeout); });
}

absl::Status TimedCollective::Barrier(absl::Duration timeout) {
  return Timed(kCollectiveOpBarrier, [&] { return inner_->Barrier(timeout); });
}

}  // namespace orthoserve
