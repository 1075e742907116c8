// Implementation of server/metrics/http_exposer.h.
#include "server/metrics/http_exposer.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

void WriteAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    sent += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpExposer>> HttpExposer::Create(const std::string& address, CollectFn collect) {
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
  std::unique_ptr<HttpExposer> exposer(new HttpExposer());
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
  exposer->thread_ = std::thread([raw] { raw->Serve(); });
  return exposer;
}

HttpExposer::~HttpExposer() {
  if (wake_fds_[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = write(wake_fds_[1], &byte, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void HttpExposer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

void HttpExposer::Answer(int connection) {
  // Read the request head (bounded in size and time: a slow client cannot hold the endpoint).
  timeval timeout{2, 0};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buffer[2048];
  while (request.size() < 16384 && request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
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
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, collect_());
    body = out.str();
  } else {
    status = path.empty() ? "405 Method Not Allowed" : "404 Not Found";
    type = "text/plain; charset=utf-8";
    body = "orthoserve serves Prometheus metrics at GET /metrics\n";
  }
  WriteAll(connection, absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ",
                                    body.size(), "\r\nConnection: close\r\n\r\n", head ? "" : body));
}

}  // namespace orthoserve
