// TimedCollective: a Collective that forwards every call to another one and reports how long
// each call took, by operation. The fleet wraps the collective of each generation in one so that
// orthoserve_collective_duration_seconds{op} sees every call its batches make, whatever the
// implementation underneath (Gloo, NCCL, or the local one of a one-rank fleet).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/collective/collective.h"

namespace orthoserve {

// The operation names TimedCollective reports (the `op` label values of the metric).
inline constexpr absl::string_view kCollectiveOpAllToAllv = "all_to_allv";
inline constexpr absl::string_view kCollectiveOpAllGatherv = "all_gatherv";
inline constexpr absl::string_view kCollectiveOpAllReduce = "all_reduce";  // AllReduceSum, float and double.
inline constexpr absl::string_view kCollectiveOpBroadcast = "broadcast";
inline constexpr absl::string_view kCollectiveOpBarrier = "barrier";

class TimedCollective final : public Collective {
 public:
  // Called after every operation with its name (one of the kCollectiveOp* above) and its wall
  // time, failed calls included (a call that timed out took its timeout). Called on the thread
  // that made the call; it must be cheap and must not call back into the collective.
  using Observer = std::function<void(absl::string_view op, absl::Duration duration)>;

  // `inner` must not be null.
  TimedCollective(std::unique_ptr<Collective> inner, Observer observer)
      : inner_(std::move(inner)), observer_(std::move(observer)) {}

  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  std::string name() const override { return inner_->name(); }
  bool ReducesDeviceMemory() const override { return inner_->ReducesDeviceMemory(); }
  bool TakesDeviceMemory() const override { return inner_->TakesDeviceMemory(); }

  absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) override;
  absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                          absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<float> values, absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<double> values, absl::Duration timeout) override;
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override;
  absl::Status Barrier(absl::Duration timeout) override;
  // Not timed: it is no operation of the group, and may come from any thread.
  void Abort(absl::string_view reason) override { inner_->Abort(reason); }

  Collective& inner() { return *inner_; }

 private:
  template <typename Call>
  absl::Status Timed(absl::string_view op, Call&& call);

  std::unique_ptr<Collective> inner_;
  Observer observer_;
};

}  // namespace orthoserve
