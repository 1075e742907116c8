// The client's side of the shared-memory handover socket (docs/shared_memory.md, "Wire"): one
// memfd passed to the server with SCM_RIGHTS, one line back. No gRPC; Region (region.h) uses it.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace orthoserve::client {

// Connects to the Unix domain socket at `socket_path`, sends one byte carrying `fd` (SCM_RIGHTS;
// the descriptor stays open here), reads the server's one-line answer and returns the ticket of
// "OK <ticket>". Every socket operation is bounded by `timeout`. Errors: INVALID_ARGUMENT for a path
// that is empty or does not fit a socket address; UNAVAILABLE when the socket cannot be reached or
// breaks (naming the path and the errno text); DEADLINE_EXCEEDED when no answer came within
// `timeout`; the server's own code for "ERR <CODE> <message>" (ParseHandoverAnswer). Thread-safe
// (one connection per call).
absl::StatusOr<std::string> HandOverMemfd(const std::string& socket_path, int fd, absl::Duration timeout);

// The ticket of an answer line "OK <ticket>" (a trailing newline is ignored). "ERR <CODE> <message>"
// becomes a status of that code (absl's names: INVALID_ARGUMENT, PERMISSION_DENIED, OUT_OF_RANGE,
// RESOURCE_EXHAUSTED, ...; UNKNOWN for a name it does not know) whose message is "the server
// refused the memfd: <message>"; anything else, "OK" without a ticket included, is UNKNOWN quoting
// the line.
absl::StatusOr<std::string> ParseHandoverAnswer(absl::string_view line);

}  // namespace orthoserve::client
