// Collective: one rank's handle on a fixed group of `world` ranks (the fleet) that exchange
// data in lock-step.
//
// Contract. Every rank of the group calls the same operations in the same order with matching
// arguments (byte counts agree pairwise; the root agrees); mismatched calls are a programming
// error that may hang until the timeout. Each call blocks until this rank's part is complete
// and returns OK, DEADLINE_EXCEEDED when the timeout passes first, or UNAVAILABLE when a peer
// is gone or the transport failed (with the library's message). Arguments that are wrong on
// their face (a span whose size is not world, a root out of range, recv_bytes[rank()] !=
// send_bytes) give INVALID_ARGUMENT before anything is sent. After any non-OK return the
// collective is broken: every later call returns UNAVAILABLE, and the owner re-forms the group
// (an implementation closes its connections on error, so peers fail fast instead of waiting for
// their timeout). A call that moves no bytes at all may return OK without synchronizing.
// Buffers are host memory unless an implementation says otherwise (the NCCL implementation also
// accepts device pointers of its own GPU); the caller keeps them alive for the call. A
// Collective is used by one thread at a time.
//
// Sums are bit-identical on every rank and deterministic for a given world: implementations add
// rank contributions in rank order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace orthoserve {

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  // "gloo", "nccl" or "local" (world 1, no transport).
  virtual std::string name() const = 0;

  // Whether AllReduceSum also takes device pointers of this rank's GPU (the buffers a GPU backend
  // computes in), reducing them where they are. False (the default): host memory only.
  virtual bool ReducesDeviceMemory() const { return false; }
  // Whether every operation (exchanges, gathers, sums, broadcasts) also takes device pointers of
  // this rank's GPU, moving them device to device: the distributed algorithms then keep a batch's
  // blocks in the backend's device memory. False (the default): host memory only.
  virtual bool TakesDeviceMemory() const { return false; }

  // Personalized exchange. `send` holds world segments back to back, segment p (send_bytes[p]
  // bytes) going to rank p; `recv` receives world segments, segment p (recv_bytes[p] bytes)
  // from rank p. send_bytes[q] on rank p must equal recv_bytes[p] on rank q. The segment to
  // self is copied locally. Zero-byte segments are allowed. `send` and `recv` must not overlap.
  virtual absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                                 absl::Span<const size_t> recv_bytes, absl::Duration timeout) = 0;

  // Every rank contributes `send_bytes` bytes; `recv` receives the contributions of ranks
  // 0..world-1 back to back, recv_bytes[p] from rank p (recv_bytes[rank()] == send_bytes).
  // In place is allowed: `send` may be exactly this rank's segment of `recv`.
  virtual absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv,
                                  absl::Span<const size_t> recv_bytes, absl::Duration timeout) = 0;

  // Element-wise sum over all ranks, in place; every rank passes the same count.
  virtual absl::Status AllReduceSum(absl::Span<float> values, absl::Duration timeout) = 0;
  virtual absl::Status AllReduceSum(absl::Span<double> values, absl::Duration timeout) = 0;

  // Copies `bytes` bytes from `root`'s buffer into every other rank's buffer; every rank passes
  // the same `bytes` and `root`.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) = 0;

  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier(absl::Duration timeout) = 0;

  // The one method that may be called from any thread, while another thread is inside an
  // operation: breaks the collective so that the operation in progress (if any) returns
  // UNAVAILABLE promptly (naming `reason`) instead of waiting for its timeout, and every later
  // call returns UNAVAILABLE. The fleet calls it when a member of the group is known to be gone.
  // Idempotent; an abort after the collective broke on its own keeps the first error.
  virtual void Abort(absl::string_view reason) = 0;
};

}  // namespace orthoserve
