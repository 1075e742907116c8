// Implementation of server/fleet/logic/address.h.
#include "server/fleet/logic/address.h"

#include "absl/strings/str_cat.h"

namespace orthoserve {

std::string HostOf(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

std::string JoinHostPort(const std::string& host, int port) {
  return absl::StrCat(host.find(':') == std::string::npos ? host : absl::StrCat("[", host, "]"), ":", port);
}

}  // namespace orthoserve
