// The Unix domain socket on which same-host clients hand memfds over (docs/shared_memory.md):
// a client connects, sends one message of at least one byte carrying exactly one descriptor
// (SCM_RIGHTS), and reads one line back — "OK <ticket>\n", or "ERR <CODE> <message>\n" after
// which the server closes the connection. The descriptor is checked and mapped
// (MappedRegion::Map) and staged in the RegionRegistry under the ticket, which the client then
// presents to RegisterRegion with its tenant's token. No gRPC.
//
// After "OK" the connection stays open: it is the region's lifeline. The client keeps it for as
// long as it holds the region and sends nothing more on it; when it ends — the client closed it,
// or the kernel did because the process died (SIGKILL, OOM), in whatever PID namespace — or
// anything arrives on it, the region staged or registered through it is dropped
// (RegionRegistry::DropLifeline). Lifelines whose region is gone (unregistered, ticket expired)
// are closed by the server. At most Options::max_lifelines are held; a handover beyond that is
// answered "ERR RESOURCE_EXHAUSTED ...".
//
// A client may instead send one CUDA_IPC line and no descriptor (cuda_ipc_message.h): part of
// one of its GPU allocations, by CUDA IPC memory handle. It is opened by Options::open_cuda_ipc
// (the backend's, on the server's GPU) and staged and answered the same way; without that
// function (a cpu backend) the answer is "ERR FAILED_PRECONDITION ...". The handle's bytes travel
// only on this socket, never over gRPC.
//
// The peer is identified by the kernel (SO_PEERCRED) as the connection is accepted, before
// anything is read from it: a uid not accepted is answered "ERR PERMISSION_DENIED ..." and the
// connection closed at once. One thread serves every connection (no thread per connection): it
// polls the listening socket, the connections whose message is still arriving (non-blocking, at
// most Options::max_handshakes, each due within Options::message_timeout of its accept) and the
// lifelines together, so that an idle or trickling connection holds up no other hand-over. A
// connection beyond max_handshakes is answered "ERR RESOURCE_EXHAUSTED ..." and closed; one whose
// message is not whole by its deadline, "ERR DEADLINE_EXCEEDED ...".
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/shm/cuda_ipc_message.h"
#include "server/shm/handover_connection.h"
#include "server/shm/region_memory.h"
#include "server/shm/region_registry.h"

namespace orthoserve {

class HandoverSocket {
 public:
  struct Options {
    std::string path;                                // Absolute socket path (at most 107 bytes).
    std::vector<uid_t> peer_uids;                    // Uids that may hand memory over; empty: the server's own.
    std::vector<std::string> reserved_paths;         // Files the server uses itself: refused as `path`.
    mode_t mode = 0660;                              // Permissions of the socket file.
    absl::Duration message_timeout = absl::Seconds(1);  // From a connection's accept to its whole message.
    absl::Duration prune_period = absl::Seconds(1);     // How often expired tickets (and idle lifelines) are dropped.
    int max_lifelines = 1024;                           // Handover connections held open (one per region).
    int max_handshakes = 64;                            // Connections accepted whose message is still arriving.
    // Told the outcome of each connection: "staged"; "refused_peer" (its uid, on accept);
    // "refused_message", "refused_memfd", "refused_cuda_ipc" (what it sent); "exhausted" (beyond
    // max_handshakes or max_lifelines, or the registry's cap on staged regions); "timed_out" (no
    // whole message within message_timeout). For metrics; may be empty. Called on the socket's thread.
    std::function<void(absl::string_view outcome)> observe;
    // Told of each region dropped because its lifeline ended (RegionRegistry::kStaged or
    // kRegistered; never kNothing), for metrics; may be empty. Called on the socket's thread.
    std::function<void(RegionRegistry::Dropped dropped)> on_dropped;
    // Opens the GPU memory a CUDA_IPC message names (its size already checked against the
    // registry's max_region_bytes); its error is the answer. Null: CUDA IPC messages are refused
    // with FAILED_PRECONDITION. Called on the socket's thread.
    std::function<absl::StatusOr<std::unique_ptr<RegionMemory>>(const CudaIpcHandover&)> open_cuda_ipc;
  };

  // Checks `options.path` (absolute, fits sun_path, none of reserved_paths), removes a stale
  // socket there (one nobody answers on), binds and listens, and starts serving into `registry`
  // (not owned; outlives the socket). FAILED_PRECONDITION when a live socket (another server) or a
  // file that is not a socket is at the path; INVALID_ARGUMENT for a bad path; UNAVAILABLE when
  // the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<HandoverSocket>> Start(Options options, RegionRegistry* registry);

  HandoverSocket(const HandoverSocket&) = delete;
  HandoverSocket& operator=(const HandoverSocket&) = delete;
  // Stops serving, closes the socket and removes its file (when it is still the one it made).
  ~HandoverSocket();

  const std::string& path() const { return options_.path; }

 private:
  // A held handover connection and the id its region was staged under.
  struct Lifeline {
    int fd;
    uint64_t id;
  };

  HandoverSocket(Options options, RegionRegistry* registry, int listen_fd, int stop_fd, dev_t dev, ino_t ino);
  void Serve();
  // How long the next poll may wait: until the next prune or the earliest handshake deadline.
  int PollTimeoutMs(absl::Time now, absl::Time next_prune) const;
  // Accepts what is waiting on the listening socket: checks each peer's uid and the bound on
  // handshakes (answering and closing a refused connection at once) and reads what it has sent.
  void Accept(absl::Time now);
  // Reads the handshakes with an event in `events` (parallel to handshakes_), answers those whose
  // message is whole or whose deadline has passed, and keeps the others.
  void ServeHandshakes(const pollfd* events, absl::Time now);
  // Reads what `connection` has sent when `readable`; answers and disposes of it (a lifeline when
  // staged) when its message is whole or its deadline has passed. Whether it is done.
  bool Advance(HandoverConnection& connection, bool readable, absl::Time now);
  // Serves a whole message; returns its outcome (Options::observe): "staged" when the connection
  // is to be held as the lifeline of the region staged under `lifeline`.
  const char* Handle(HandoverConnection& connection, HandoverConnection::Message message, uint64_t lifeline);
  // Serves a CUDA_IPC message (read whole up to its newline, if it has one).
  const char* HandleCudaIpc(HandoverConnection& connection, uint64_t lifeline);
  // Drops the regions of the lifelines with an event in `events` (parallel to lifelines_) and
  // closes those, and the lifelines whose region the registry no longer holds when `reap`.
  void EndLifelines(const pollfd* events, bool reap);
  void Observe(const char* outcome) const;

  const Options options_;
  RegionRegistry* const registry_;
  const int listen_fd_;
  const int stop_fd_;  // An eventfd written to stop Serve.
  const dev_t dev_;    // The socket file this server made, to remove only that one.
  const ino_t ino_;
  // Used only by the thread that runs Serve (and by the destructor after it ended).
  std::vector<HandoverConnection> handshakes_;  // Accepted, message still arriving; oldest first.
  std::vector<Lifeline> lifelines_;
  uint64_t next_lifeline_ = 1;
  std::thread thread_;
};

}  // namespace orthoserve
