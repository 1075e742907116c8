// One accepted connection of the handover socket whose message is still arriving
// (docs/shared_memory.md, "Wire"): what has been read of it, without blocking, and what the
// message is once it is whole. The socket's thread polls many of these at once, each with its own
// deadline (server/shm/handover_socket.h), so that no connection waits for another.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/shm/region_registry.h"

namespace orthoserve {

class HandoverConnection {
 public:
  // What a message is, once it is whole.
  enum class Message {
    kIncomplete,   // Still arriving: read again when the connection is readable.
    kMemfd,        // At least one byte carrying exactly one descriptor (memfd()).
    kCudaIpcLine,  // Text with no descriptor that starts with the CUDA_IPC prefix (text(); not parsed yet).
    kMalformed,    // Anything else: nothing before the end, several descriptors, a truncated control message,
                   // other text.
  };

  // Takes `fd` (a non-blocking connection accepted from `peer`), whose message is due by `deadline`.
  HandoverConnection(int fd, const PeerIdentity& peer, absl::Time deadline);
  HandoverConnection(HandoverConnection&& other) noexcept;
  HandoverConnection& operator=(HandoverConnection&& other) noexcept;
  HandoverConnection(const HandoverConnection&) = delete;
  HandoverConnection& operator=(const HandoverConnection&) = delete;
  // Closes the connection (unless released) and every descriptor received and not taken.
  ~HandoverConnection();

  // Reads what has arrived, without blocking, and says what the message is: kIncomplete until the
  // peer has sent a descriptor, a whole CUDA_IPC line (up to its newline, or kMaxCudaIpcMessageBytes),
  // text that cannot become one, or ended its side of the connection.
  Message Read();

  int fd() const { return fd_; }
  const PeerIdentity& peer() const { return peer_; }
  absl::Time deadline() const { return deadline_; }
  // The message's bytes so far.
  const std::string& text() const { return text_; }
  // The one descriptor of a kMemfd message; the caller owns it from then on (-1 after the first call).
  int TakeMemfd();
  // Gives the connection up to the caller (a lifeline from then on); this object closes it no more.
  int Release();

 private:
  // Whether what has been read is all the message will be (Read's stopping rule).
  bool Whole() const;
  Message Kind() const;
  void CloseAll();

  int fd_;
  PeerIdentity peer_;
  absl::Time deadline_;
  std::string text_;
  std::vector<int> fds_;   // Descriptors received (SCM_RIGHTS) and not taken.
  bool first_read_ = false;  // The first message (the one that may carry descriptors) has been read.
  bool truncated_ = false;   // Its control data did not fit (MSG_CTRUNC): more descriptors than room.
  bool ended_ = false;       // The peer ended its side, or the connection failed.
};

}  // namespace orthoserve
