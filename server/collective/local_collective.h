// LocalCollective: the world-1 Collective of a one-process fleet. There is no transport; every
// operation is a local copy (or nothing), so it never times out.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/collective/collective.h"

namespace orthoserve {

// Rank 0 of a group of one. Follows the Collective contract: malformed arguments give
// INVALID_ARGUMENT and break the collective (later calls: UNAVAILABLE). Not thread-safe (one
// thread at a time, as every Collective).
class LocalCollective final : public Collective {
 public:
  // Copies `bytes` bytes from `src` to `dst` (which do not overlap) in one memory, synchronously.
  using Copy = std::function<absl::Status(void* dst, const void* src, size_t bytes)>;

  // Exchanges copy with memcpy: host memory only.
  LocalCollective() = default;
  // Exchanges copy with `device_copy`, a copy within a backend's device memory: the collective
  // then takes device memory (TakesDeviceMemory), and a one-rank batch keeps its blocks there
  // (a lone client's matrix in a CUDA IPC region, server/distributed/local_batch.h).
  explicit LocalCollective(Copy device_copy) : device_copy_(std::move(device_copy)) {}

  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "local"; }
  // A sum over one rank reads and writes nothing: any memory will do.
  bool ReducesDeviceMemory() const override { return true; }
  bool TakesDeviceMemory() const override { return device_copy_ != nullptr; }

  // Copies send_bytes[0] bytes from `send` to `recv`.
  absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) override;
  // Copies `send_bytes` bytes from `send` to `recv` (nothing when they are the same buffer).
  absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                          absl::Duration timeout) override;
  // The sum over one rank is the input: leaves `values` unchanged.
  absl::Status AllReduceSum(absl::Span<float> values, absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<double> values, absl::Duration timeout) override;
  // `root` must be 0; leaves `data` unchanged.
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override;
  absl::Status Barrier(absl::Duration timeout) override;
  void Abort(absl::string_view reason) override;

 private:
  // OK, or UNAVAILABLE when an earlier call failed.
  absl::Status CheckUsable() const ABSL_LOCKS_EXCLUDED(mu_);
  // Records a failure (breaking the collective) and returns it.
  absl::Status Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // Copies a segment to itself: memmove, or the device copy.
  absl::Status CopySelf(void* dst, const void* src, size_t bytes);

  const Copy device_copy_;  // Null: host memory.
  mutable absl::Mutex mu_;  // Abort may come from another thread.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve
