// Test helpers for server/shm: a client's side of the handover (a sealed memfd, passed over the
// socket) written against the kernel directly, so that the tests exercise the server's checks
// with descriptors a real client would make, and with ones it should not.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace orthoserve {

// An owned descriptor, closed at the end of its scope.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~OwnedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// A memfd of `size` bytes, sealed against shrinking when `seal_shrink`. Fails the test (and
// returns -1) when the kernel refuses.
inline OwnedFd MakeMemfd(int64_t size, bool seal_shrink = true) {
  OwnedFd fd(memfd_create("orthoserve-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_GE(fd.get(), 0) << std::strerror(errno);
  EXPECT_EQ(ftruncate(fd.get(), size), 0) << std::strerror(errno);
  if (seal_shrink) {
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0) << std::strerror(errno);
  }
  return fd;
}

// A connection to the handover socket at `path` that has sent nothing (fails the test and returns
// an empty OwnedFd when it cannot connect). Its receives time out after 5 s.
inline OwnedFd Connect(const std::string& path) {
  OwnedFd conn(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "connect " << path << ": " << std::strerror(errno);
    return OwnedFd();
  }
  timeval tv{5, 0};  // Every wait has a deadline.
  setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return conn;
}

// The server's one-line answer on `conn` (without the newline): what arrives before a newline, the
// end of the connection, an error or the connection's receive timeout.
inline std::string ReadAnswer(int conn) {
  std::string answer;
  char buf[256];
  for (int i = 0; i < 64; ++i) {  // Bounded: the answer is one short line.
    const ssize_t n = recv(conn, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
    if (answer.find('\n') != std::string::npos) break;
  }
  if (!answer.empty() && answer.back() == '\n') answer.pop_back();
  return answer;
}

// Connects to the handover socket at `path`, sends one byte with `fds` (count of them) and
// returns the server's answer line (without the newline), or "connect failed: ..." etc. The
// connection — the region's lifeline after "OK" — is moved to `*lifeline` when it is given (the
// region lives as long as that is open), else closed (a staged region is then dropped).
inline std::string HandOver(const std::string& path, const int* fds, int count, OwnedFd* lifeline = nullptr) {
  OwnedFd conn(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::StrCat("connect failed: ", std::strerror(errno));
  }
  timeval tv{5, 0};  // Every wait has a deadline.
  setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte = 'M';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * count);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * count);
  }
  if (sendmsg(conn.get(), &msg, MSG_NOSIGNAL) != 1) {
    // A server that refused the peer on accept has answered and closed already: its answer is the reason.
    const std::string error = absl::StrCat("sendmsg failed: ", std::strerror(errno));
    const std::string answer = ReadAnswer(conn.get());
    return answer.empty() ? error : answer;
  }
  std::string answer = ReadAnswer(conn.get());
  if (lifeline != nullptr) *lifeline = std::move(conn);
  return answer;
}

// Connects to the handover socket at `path`, sends `text` with no descriptor — in two writes,
// the second `pause_ms` after the first, when `split` is inside it — and returns the server's answer
// line (without the newline), or "connect failed: ..." etc. The connection is moved to `*lifeline`
// when it is given (as for HandOver), else the client shuts its sending side after `text` and closes it.
inline std::string HandOverLine(const std::string& path, const std::string& text, size_t split = 0, int pause_ms = 50,
                                OwnedFd* lifeline = nullptr) {
  OwnedFd conn(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::StrCat("connect failed: ", std::strerror(errno));
  }
  timeval tv{5, 0};  // Every wait has a deadline.
  setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const size_t first = split > 0 && split < text.size() ? split : text.size();
  bool sent = send(conn.get(), text.data(), first, MSG_NOSIGNAL) == static_cast<ssize_t>(first);
  if (sent && first < text.size()) {
    usleep(static_cast<useconds_t>(pause_ms) * 1000);
    const size_t rest = text.size() - first;
    sent = send(conn.get(), text.data() + first, rest, MSG_NOSIGNAL) == static_cast<ssize_t>(rest);
  }
  if (!sent) {
    // As in HandOver: a refusal on accept was answered before the server closed.
    const std::string error = absl::StrCat("send failed: ", std::strerror(errno));
    const std::string answer = ReadAnswer(conn.get());
    return answer.empty() ? error : answer;
  }
  // Nothing more comes: a line without its newline is seen at once. (Not on a lifeline, whose end
  // would drop the region.)
  if (lifeline == nullptr) shutdown(conn.get(), SHUT_WR);
  std::string answer = ReadAnswer(conn.get());
  if (lifeline != nullptr) *lifeline = std::move(conn);
  return answer;
}

}  // namespace orthoserve
