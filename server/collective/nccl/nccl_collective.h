// NcclCollective: the Collective of server/collective/collective.h over NCCL, one rank per GPU.
// This header includes no CUDA or NCCL header (pimpl), so non-CUDA code may include it.
//
// Contract (beyond collective.h).
//  - Bootstrap: with a Store, rank 0 calls ncclGetUniqueId and Sets it (hex) under
//    `id_key`; the other ranks Get it. Without a Store the id comes from ncclGetUniqueId on
//    every rank, which is only meaningful when NCCL_COMM_ID names the bootstrap address (NCCL's
//    own mechanism) or world is 1; otherwise Create returns INVALID_ARGUMENT.
//  - The communicator is created non-blocking (ncclConfig_t.blocking = 0). Create returns
//    FAILED_PRECONDITION without a usable device, DEADLINE_EXCEEDED when init does not finish
//    within init_timeout, UNAVAILABLE for an NCCL failure.
//  - Buffers may be host memory (staged through a device buffer of this rank) or device memory
//    of this rank's GPU (used in place; detected with cudaPointerGetAttributes). Device memory
//    of another GPU is INVALID_ARGUMENT. Device buffers must be complete when passed (the caller
//    has synchronized the stream that wrote them): the collective's stream does not wait for it.
//  - Watchdog: while an operation is in flight the calling thread polls ncclCommGetAsyncError
//    and the operation's deadline; on an error it aborts the communicator (ncclCommAbort) and
//    returns UNAVAILABLE with NCCL's message, on timeout DEADLINE_EXCEEDED. The collective is
//    then broken (later calls: UNAVAILABLE). On one host (P2P/NVLink/shared memory) the abort
//    does not reach the peers: they see the failure only at their own deadline. The destructor
//    finalizes a healthy communicator (flushing what was issued, bounded by 10 s) and aborts a
//    broken one.
//  - Operations leave no CUDA error behind on the calling thread (a polled cudaErrorNotReady
//    is cleared), so kernels launched next on that thread report only their own errors.
//  - AllReduceSum is an all-gather of every rank's values followed by a sum on the device in
//    rank order (((v0 + v1) + v2) + ...), so it is bit-identical on every rank and deterministic;
//    NCCL's own ring/tree all-reduce adds in an order that depends on the topology and is not
//    used. It costs world × count elements of device memory and world× the bytes on the wire.
// One thread at a time, as every Collective.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/collective/collective.h"
#include "server/collective/store.h"

namespace orthoserve {

class NcclCollective final : public Collective {
 public:
  struct Options {
    int rank = 0;                                    // This rank, in [0, world).
    int world = 1;                                   // Number of ranks (GPUs).
    int device = 0;                                  // This rank's CUDA device ordinal.
    Store* store = nullptr;                          // Rendezvous for the unique id; not owned; may be null.
    std::string id_key = "nccl/unique_id";           // Store key of the unique id (one per fleet generation).
    absl::Duration init_timeout = absl::Minutes(2);  // Bound on the id exchange and communicator init.
  };

  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(const Options& options);
  ~NcclCollective() override;

  int rank() const override;
  int world() const override;
  std::string name() const override { return "nccl"; }
  // Every operation takes device pointers of this rank's GPU (AllReduceSum reduces them in place).
  bool ReducesDeviceMemory() const override { return true; }
  bool TakesDeviceMemory() const override { return true; }

  absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) override;
  absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                          absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<float> values, absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<double> values, absl::Duration timeout) override;
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override;
  absl::Status Barrier(absl::Duration timeout) override;
  // The watchdog of the operation in progress sees the request and aborts the communicator.
  void Abort(absl::string_view reason) override;

  class Impl;

 private:
  explicit NcclCollective(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orthoserve
