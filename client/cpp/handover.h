// The client's side of the shared-memory handover socket (docs/shared_memory.md, "Wire"): one
// memfd passed to the server with SCM_RIGHTS, one line back, and the connection kept open as the
// region's lifeline. No gRPC; Region (region.h) uses it.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace orthoserve::client {

// The connection a region was handed over on, kept open for as long as the region is held (its
// lifeline): the server drops the region, registered or not, when the connection ends — by Close,
// by the destructor, or by the kernel when this process dies. Nothing is sent on it. Owns the
// descriptor (SOCK_CLOEXEC: a program this process execs does not inherit it; a child forked
// without exec holds a copy, and the region then lives until both have let go). Movable; not
// thread-safe.
class Lifeline {
 public:
  Lifeline() = default;
  explicit Lifeline(int fd) : fd_(fd) {}
  Lifeline(Lifeline&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Lifeline& operator=(Lifeline&& other) noexcept;
  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;
  ~Lifeline() { Close(); }

  bool open() const { return fd_ >= 0; }
  // Closes the connection (idempotent).
  void Close();

 private:
  int fd_ = -1;
};

// What the server answered "OK" with: the ticket for RegisterRegion, and the lifeline to keep.
struct HandedOver {
  std::string ticket;
  Lifeline lifeline;
};

// Connects to the Unix domain socket at `socket_path`, sends one byte carrying `fd` (SCM_RIGHTS;
// the descriptor stays open here), reads the server's one-line answer and returns the ticket of
// "OK <ticket>" with the connection (HandedOver). Every socket operation is bounded by `timeout`. Errors: INVALID_ARGUMENT for a path
// that is empty or does not fit a socket address; UNAVAILABLE when the socket cannot be reached or
// breaks (naming the path and the errno text); DEADLINE_EXCEEDED when no answer came within
// `timeout`; the server's own code for "ERR <CODE> <message>" (ParseHandoverAnswer). Thread-safe
// (one connection per call).
absl::StatusOr<HandedOver> HandOverMemfd(const std::string& socket_path, int fd, absl::Duration timeout);

// The ticket of an answer line "OK <ticket>" (a trailing newline is ignored). "ERR <CODE> <message>"
// becomes a status of that code (absl's names: INVALID_ARGUMENT, PERMISSION_DENIED, OUT_OF_RANGE,
// RESOURCE_EXHAUSTED, ...; UNKNOWN for a name it does not know) whose message is "the server
// refused the memfd: <message>"; anything else, "OK" without a ticket included, is UNKNOWN quoting
// the line.
absl::StatusOr<std::string> ParseHandoverAnswer(absl::string_view line);

}  // namespace orthoserve::client
