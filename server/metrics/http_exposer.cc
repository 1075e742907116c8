// Implementation of server/metrics/http_exposer.h.
#include "server/metrics/http_exposer.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"

namespace orthoserve {
namespace {

// Splits "host:port" / "[v6]:port"; an empty host means every interface.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return !port->empty();
}

// Waits until `fd` is ready for `events`, the exposer stops (`wake`) or `deadline` passes;
// true when `fd` is ready.
bool WaitFor(int fd, short events, int wake, absl::Time deadline) {
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)));
    if (left <= 0) return false;
    pollfd fds[2] = {{fd, events, 0}, {wake, POLLIN, 0}};
    const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || fds[1].revents != 0) return false;
    return true;  // Ready, or an error recv/send will report.
  }
}

// Sends all of `data` by `deadline`; false when it could not.
bool WriteAll(int fd, const std::string& data, int wake, absl::Time deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    if (!WaitFor(fd, POLLOUT, wake, deadline)) return false;
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpExposer>> HttpExposer::Create(const std::string& address, CollectFn collect,
                                                                 const Options& options) {
  if (options.threads < 1 || options.connection_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the metrics endpoint needs at least one thread and a positive deadline");
  }
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-address \"", address, "\" is not HOST:PORT"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-address ", address, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<HttpExposer> exposer(new HttpExposer(options));
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      exposer->listen_fd_ = fd;
      break;
    }
    error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  if (exposer->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("--metrics-address ", address, " cannot be bound: ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(exposer->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  exposer->port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe(exposer->wake_fds_) != 0) return absl::InternalError("pipe() failed for the metrics endpoint");
  exposer->collect_ = std::move(collect);
  HttpExposer* raw = exposer.get();
  exposer->acceptor_ = std::thread([raw] { raw->Accept(); });
  for (int i = 0; i < options.threads; ++i) exposer->workers_.emplace_back([raw] { raw->Work(); });
  return exposer;
}

HttpExposer::~HttpExposer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  if (wake_fds_[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = write(wake_fds_[1], &byte, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : workers_) t.join();
  absl::MutexLock lock(&mu_);
  for (const Waiting& w : waiting_) close(w.fd);
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void HttpExposer::Accept() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) continue;
    absl::MutexLock lock(&mu_);
    if (waiting_.size() >= options_.max_waiting) {
      close(connection);  // Every thread is busy and many wait already: a flood, not a scrape.
      continue;
    }
    waiting_.push_back(Waiting{connection, absl::Now() + options_.connection_deadline});
    work_cv_.Signal();
  }
}

void HttpExposer::Work() {
  for (;;) {
    Waiting next;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && waiting_.empty()) work_cv_.Wait(&mu_);
      if (stopping_) return;
      next = waiting_.front();
      waiting_.pop_front();
    }
    Answer(next.fd, next.deadline);
    close(next.fd);
  }
}

std::string HttpExposer::Scrape() {
  absl::MutexLock lock(&collect_mu_);
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collect_());
  return out.str();
}

void HttpExposer::Answer(int connection, absl::Time deadline) {
  // Read the request head, bounded in size and, with the answer, in time: a slow client holds
  // this thread until the deadline at most.
  std::string request;
  char buffer[2048];
  while (request.size() < 16384 && request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (!WaitFor(connection, POLLIN, wake_fds_[0], deadline)) return;
    ssize_t n = recv(connection, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  const bool head = absl::StartsWith(request, "HEAD ");
  std::string path;
  if (absl::StartsWith(request, "GET ") || head) {
    size_t start = request.find(' ') + 1;
    size_t end = request.find_first_of(" ?\r\n", start);
    path = request.substr(start, end == std::string::npos ? std::string::npos : end - start);
  }
  std::string status = "200 OK";
  std::string body;
  std::string type = "text/plain; version=0.0.4; charset=utf-8";
  if (path == "/metrics") {
    body = Scrape();
  } else {
    status = path.empty() ? "405 Method Not Allowed" : "404 Not Found";
    type = "text/plain; charset=utf-8";
    body = "orthoserve serves Prometheus metrics at GET /metrics\n";
  }
  WriteAll(connection,
           absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
                        "\r\nConnection: close\r\n\r\n", head ? "" : body),
           wake_fds_[0], deadline);
}

}  // namespace orthoserve
