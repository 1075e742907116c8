// Implementation of server/shm/handover_connection.h.
#include "server/shm/handover_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "server/shm/cuda_ipc_message.h"

namespace orthoserve {
namespace {

// Whether `text`, the start of a message, is (or may still become) a CUDA_IPC line.
bool MayBeCudaIpc(absl::string_view text) {
  return absl::StartsWith(text, kCudaIpcMessagePrefix) ||
         (text.size() < kCudaIpcMessagePrefix.size() && absl::StartsWith(kCudaIpcMessagePrefix, text));
}

// Whether a failed read means "nothing yet" rather than the end of the connection.
bool WouldBlock(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

HandoverConnection::HandoverConnection(int fd, const PeerIdentity& peer, absl::Time deadline)
    : fd_(fd), peer_(peer), deadline_(deadline) {}

HandoverConnection::HandoverConnection(HandoverConnection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      peer_(other.peer_),
      deadline_(other.deadline_),
      text_(std::move(other.text_)),
      fds_(std::exchange(other.fds_, {})),
      first_read_(other.first_read_),
      truncated_(other.truncated_),
      ended_(other.ended_) {}

HandoverConnection& HandoverConnection::operator=(HandoverConnection&& other) noexcept {
  if (this != &other) {
    CloseAll();
    fd_ = std::exchange(other.fd_, -1);
    peer_ = other.peer_;
    deadline_ = other.deadline_;
    text_ = std::move(other.text_);
    fds_ = std::exchange(other.fds_, {});
    first_read_ = other.first_read_;
    truncated_ = other.truncated_;
    ended_ = other.ended_;
  }
  return *this;
}

HandoverConnection::~HandoverConnection() { CloseAll(); }

void HandoverConnection::CloseAll() {
  for (int fd : fds_) close(fd);  // Never mapped.
  fds_.clear();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

HandoverConnection::Message HandoverConnection::Read() {
  if (!first_read_) {
    // The first message alone may carry descriptors. Room for a few, so that a message with more
    // than one is seen (and refused) whole.
    char bytes[kMaxCudaIpcMessageBytes];
    iovec iov{bytes, sizeof(bytes)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && WouldBlock(errno)) return Message::kIncomplete;
    first_read_ = true;
    if (n <= 0) {
      ended_ = true;
      return Kind();
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds_.push_back(fd);
      }
    }
    truncated_ = (msg.msg_flags & MSG_CTRUNC) != 0;
    text_.assign(bytes, static_cast<size_t>(n));
  }
  // A CUDA_IPC line may arrive in more than one piece: read on up to its newline. (Descriptors in
  // later pieces are dropped by the kernel: recv takes no control data.)
  char buffer[kMaxCudaIpcMessageBytes];
  while (!Whole()) {
    const ssize_t n = recv(fd_, buffer, kMaxCudaIpcMessageBytes - text_.size(), MSG_DONTWAIT);
    if (n < 0 && WouldBlock(errno)) return Message::kIncomplete;
    if (n <= 0) {
      ended_ = true;
      break;
    }
    text_.append(buffer, static_cast<size_t>(n));
  }
  return Kind();
}

bool HandoverConnection::Whole() const {
  if (ended_) return true;
  if (!first_read_) return false;
  if (!fds_.empty() || truncated_ || !MayBeCudaIpc(text_)) return true;
  return text_.find('\n') != std::string::npos || text_.size() >= kMaxCudaIpcMessageBytes;
}

HandoverConnection::Message HandoverConnection::Kind() const {
  if (!Whole()) return Message::kIncomplete;
  if (fds_.empty() && !truncated_ && absl::StartsWith(text_, kCudaIpcMessagePrefix)) return Message::kCudaIpcLine;
  if (text_.empty() || fds_.size() != 1 || truncated_) return Message::kMalformed;
  return Message::kMemfd;
}

int HandoverConnection::TakeMemfd() {
  if (fds_.size() != 1) return -1;
  const int fd = fds_[0];
  fds_.clear();
  return fd;
}

int HandoverConnection::Release() { return std::exchange(fd_, -1); }

}  // namespace orthoserve
