// HOST:PORT addresses as the fleet writes them ("host:port", "[v6]:port").
#pragma once

#include <string>

namespace orthoserve {

// "host:port" or "[v6]:port" → host (brackets removed); an address without a port is the host.
std::string HostOf(const std::string& address);
// `host` and `port` as one address, an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

}  // namespace orthoserve
