// GlooCollective: the Collective of CPU fleets, over Gloo's TCP transport (one connection per
// pair of ranks, full mesh, rendezvous through our Store).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"
#include "server/collective/store.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace orthoserve {

// Follows the Collective contract (collective.h). All operations are built on one primitive:
// every rank posts its point-to-point sends and receives (Gloo unbound buffers) and waits for
// all of them under one deadline. Zero-byte segments are never put on the wire: both ends know
// the count is zero, so they skip it (no message, no matching needed); a call whose segments
// are all empty returns without synchronizing. AllReduceSum is a reduce-scatter (each rank
// owns a contiguous slice of the elements, receives every rank's copy of it and adds them in
// rank order 0, 1, ..., world-1) followed by an all-gather of the summed slices: every element
// is added by exactly one rank in rank order, so the result is deterministic and bit-identical
// on every rank, while each rank moves about 2·(world-1)/world of the data, as a ring would.
// Broadcast sends from the root straight to each rank; Barrier exchanges a one-byte token with
// every rank. Gloo's exceptions never cross this API (gloo_status.h maps them: timeouts to
// DEADLINE_EXCEEDED, everything else to UNAVAILABLE). On any error the connections are closed,
// which fails the peers' pending calls promptly with UNAVAILABLE. One thread at a time.
class GlooCollective final : public Collective {
 public:
  struct Options {
    int rank = 0;                                // This rank, in [0, world).
    int world = 1;                               // Number of ranks in the group.
    Store* store = nullptr;                      // Rendezvous store; not owned; used only inside Create.
    std::string prefix;                          // Scopes the store keys ("<prefix>/gloo/<rank>"), e.g. "gen-3".
    std::string hostname = "127.0.0.1";          // Address (or name) to bind and advertise to peers.
    std::string interface;                       // Network interface to bind, e.g. "eth0"; overrides hostname.
    absl::Duration timeout = absl::Seconds(30);  // Bound on each rendezvous step (store wait, connect).
  };

  // Joins the group: publishes this rank's listening addresses under the prefix and connects
  // to every other rank. Blocks until all `world` ranks have called Create with the same
  // store, prefix and world. INVALID_ARGUMENT for bad options (naming the field; also an
  // interface that does not exist, a hostname that does not resolve),
  // DEADLINE_EXCEEDED when peers do not appear in time (naming the missing store keys),
  // UNAVAILABLE when binding or connecting fails. Reusing a prefix whose keys were set by an
  // earlier group connects to stale addresses: use a fresh prefix per group generation.
  // Process-wide side effect: SIGPIPE is set to ignored if it still has its default action
  // (Gloo writes to sockets without MSG_NOSIGNAL; a vanished peer would otherwise kill the
  // process instead of giving UNAVAILABLE). A disposition the program installed is kept.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Create(const Options& options);

  ~GlooCollective() override;
  GlooCollective(const GlooCollective&) = delete;
  GlooCollective& operator=(const GlooCollective&) = delete;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "gloo"; }

  absl::Status AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) override;
  absl::Status AllGatherv(const void* send, size_t send_bytes, void* recv, absl::Span<const size_t> recv_bytes,
                          absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<float> values, absl::Duration timeout) override;
  absl::Status AllReduceSum(absl::Span<double> values, absl::Duration timeout) override;
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override;
  absl::Status Barrier(absl::Duration timeout) override;
  // Aborts the waits of the exchange in progress (Gloo's abortWaitSend/abortWaitRecv; that
  // exchange then closes every connection) and breaks the collective. With no exchange in
  // progress it closes every connection itself, so that peers waiting on this rank fail now
  // rather than at their timeout.
  void Abort(absl::string_view reason) override ABSL_LOCKS_EXCLUDED(abort_mu_);

 private:
  // One point-to-point transfer: `bytes` bytes at `offset` of the send or receive buffer.
  struct Transfer {
    int peer;
    size_t offset;
    size_t bytes;
  };

  GlooCollective(int rank, int world, std::shared_ptr<gloo::Context> context);

  // OK, or UNAVAILABLE when an earlier call failed.
  absl::Status CheckUsable() const ABSL_LOCKS_EXCLUDED(abort_mu_);
  // Breaks the collective with `status` (closing every connection) and returns it.
  absl::Status Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(abort_mu_);
  // Drops the context, which closes every pair once no buffer of an exchange holds it.
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_);
  // Posts `recvs` into `recv` (recv_size bytes) and `sends` from `send` (send_size bytes) and
  // waits for all of them until `deadline`. Every rank calls it the same number of times per
  // operation (each call takes the next tag), whatever its transfers.
  absl::Status Exchange(const char* op, const void* send, size_t send_size, absl::Span<const Transfer> sends,
                        void* recv, size_t recv_size, absl::Span<const Transfer> recvs, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(abort_mu_);
  template <typename T>
  absl::Status AllReduceSumImpl(absl::Span<T> values, absl::Duration timeout);

  const int rank_;
  const int world_;
  uint32_t next_tag_ = 0;
  absl::Status broken_;  // Written by the operating thread only.

  // Abort() from another thread: the flag, whether an exchange is using the context, and the
  // buffers whose waits it interrupts. context_ is reset only under abort_mu_; an exchange takes
  // its pointer under abort_mu_ as it marks itself in progress (in_exchange_), and while it is,
  // only the exchange's own thread resets context_.
  mutable absl::Mutex abort_mu_;
  std::shared_ptr<gloo::Context> context_ ABSL_GUARDED_BY(abort_mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(abort_mu_);
  bool in_exchange_ ABSL_GUARDED_BY(abort_mu_) = false;
  gloo::transport::UnboundBuffer* sending_ ABSL_GUARDED_BY(abort_mu_) = nullptr;
  gloo::transport::UnboundBuffer* receiving_ ABSL_GUARDED_BY(abort_mu_) = nullptr;
};

}  // namespace orthoserve
