// Implementation of client/cpp/handover.h.
#include "client/cpp/handover.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/message_text.h"

namespace orthoserve::client {
namespace {

// The longest answer read: the server's line is short (a ticket, or a code and a message).
constexpr size_t kMaxAnswerBytes = 4096;

absl::Status SocketError(const std::string& path, absl::string_view what) {
  const int error = errno;
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return absl::DeadlineExceededError(
        absl::StrCat("the shared-memory socket ", path, " did not answer in time (", what, ")"));
  }
  return absl::UnavailableError(
      absl::StrCat("the shared-memory socket ", path, " did not take the memfd: ", what, ": ", std::strerror(error)));
}

absl::StatusCode CodeNamed(absl::string_view name) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(code) == name) return code;
  }
  return absl::StatusCode::kUnknown;
}

}  // namespace

Lifeline& Lifeline::operator=(Lifeline&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Lifeline::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<std::string> ParseHandoverAnswer(absl::string_view line) {
  line = absl::StripTrailingAsciiWhitespace(line);
  if (absl::StartsWith(line, "OK ")) {
    absl::string_view ticket = absl::StripAsciiWhitespace(line.substr(3));
    if (!ticket.empty()) return std::string(ticket);
  } else if (absl::StartsWith(line, "ERR ")) {
    absl::string_view rest = line.substr(4);
    const size_t space = rest.find(' ');
    const absl::string_view name = rest.substr(0, space);
    const absl::string_view message = space == absl::string_view::npos ? "" : rest.substr(space + 1);
    absl::StatusCode code = CodeNamed(name);
    if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;  // "ERR OK" is no refusal we know.
    return absl::Status(code, absl::StrCat("the server refused the memfd: ",
                                           message.empty() ? BoundedText(line) : std::string(message)));
  }
  return absl::UnknownError(
      absl::StrCat("the shared-memory socket answered \"", BoundedText(line), "\", not OK or ERR"));
}

absl::StatusOr<HandedOver> HandOverMemfd(const std::string& socket_path, int fd, absl::Duration timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("the shared-memory socket path \"", socket_path,
                                                   "\" is empty or longer than ", sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return SocketError(socket_path, "socket");
  Lifeline connection(s);  // Closed on every path but success.
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return SocketError(socket_path, "connect");
  }
  // One byte with the descriptor; MSG_NOSIGNAL: a server gone is an error, not SIGPIPE.
  char byte = 'M';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t sent;
  do {
    sent = sendmsg(s, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  // A server that refuses on accept (a peer uid it does not take, too many hand-overs at once)
  // answers and closes before reading: the send may then fail, and the answer says why.
  const absl::Status send_failed = sent == 1 ? absl::OkStatus() : SocketError(socket_path, "sendmsg");
  // One short line; after "OK" the connection stays open (the lifeline), after "ERR" the server closes it.
  std::string answer;
  char buf[512];
  while (answer.size() < kMaxAnswerBytes && !absl::EndsWith(answer, "\n")) {
    const ssize_t n = recv(s, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return send_failed.ok() ? SocketError(socket_path, "reading the answer") : send_failed;
    if (n == 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  if (answer.empty() && !send_failed.ok()) return send_failed;
  if (!send_failed.ok() && absl::StartsWith(answer, "OK")) return send_failed;  // Never a ticket for an unsent memfd.
  if (answer.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the shared-memory socket ", socket_path, " closed the connection without an answer"));
  }
  absl::StatusOr<std::string> ticket = ParseHandoverAnswer(answer);
  if (!ticket.ok()) return ticket.status();
  return HandedOver{*std::move(ticket), std::move(connection)};
}

}  // namespace orthoserve::client
