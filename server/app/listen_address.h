// What a public listen address (--listen) can be reached from: only this host, or more.
#pragma once

#include "absl/strings/string_view.h"

namespace orthoserve {

// Whether a server listening on `address` (as gRPC takes it: "HOST:PORT", "[V6]:PORT",
// "unix:PATH", "unix-abstract:NAME") can be reached from this host only: a loopback address
// (127.0.0.0/8, ::1, ::ffff:127.x.y.z), "localhost", or a Unix domain socket. Anything else is
// false, whether it is reachable or not: a wildcard ("0.0.0.0", "[::]", an empty host), another
// address, or a host name (it may resolve to anything).
bool IsLoopbackListenAddress(absl::string_view address);

}  // namespace orthoserve
