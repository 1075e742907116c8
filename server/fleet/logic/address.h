// HOST:PORT addresses as the fleet writes them ("host:port", "[v6]:port").
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve {

// "host:port" or "[v6]:port" → host (brackets removed); an address without a port is the host.
std::string HostOf(const std::string& address);
// `host` and `port` as one address, an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

// OK when `address` is one the fleet writes: "host:port" with a host of letters, digits, '.',
// '-' and '_' (a DNS name or an IPv4 address), or "[v6]:port" with an IPv6 address (hex digits,
// ':' and '.'; a zone after '%' of letters, digits, '.', '-' and '_'), and a decimal port 1 to
// 65535, at most 261 bytes in all. Nothing else: no scheme ("unix:", "dns:///"), no whitespace.
// INVALID_ARGUMENT saying what is wrong (the address is not quoted: the caller names it).
absl::Status CheckHostPort(absl::string_view address);

}  // namespace orthoserve
