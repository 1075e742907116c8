// Implementation of server/fleet/logic/address.h.
#include "server/fleet/logic/address.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace orthoserve {
namespace {

// A DNS name's longest text form, plus brackets, a colon and a 5-digit port.
constexpr size_t kMaxAddressBytes = 253 + 2 + 1 + 5;

bool NameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'; }

bool V6Char(char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; }

// The host part: a name or IPv4 address, or "[v6]" (optionally with a "%zone").
bool HostOk(absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    absl::string_view v6 = host.substr(1, host.size() - 2);
    absl::string_view zone;
    if (const size_t percent = v6.find('%'); percent != absl::string_view::npos) {
      zone = v6.substr(percent + 1);
      v6 = v6.substr(0, percent);
      if (zone.empty()) return false;
    }
    if (v6.find(':') == absl::string_view::npos) return false;
    for (char c : v6) {
      if (!V6Char(c)) return false;
    }
    for (char c : zone) {
      if (!NameChar(c)) return false;
    }
    return true;
  }
  if (host.empty()) return false;
  for (char c : host) {
    if (!NameChar(c)) return false;
  }
  return true;
}

}  // namespace

std::string HostOf(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

std::string JoinHostPort(const std::string& host, int port) {
  return absl::StrCat(host.find(':') == std::string::npos ? host : absl::StrCat("[", host, "]"), ":", port);
}

absl::Status CheckHostPort(absl::string_view address) {
  if (address.empty() || address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an address of ", address.size(), " bytes is not HOST:PORT (1 to ", kMaxAddressBytes, " bytes)"));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return absl::InvalidArgumentError("the address has no :PORT");
  const absl::string_view port = address.substr(colon + 1);
  int value = 0;
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) {
    digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
    if (digits) value = 10 * value + (c - '0');
  }
  if (!digits || value < 1 || value > 65535 || port.front() == '0') {
    return absl::InvalidArgumentError("the address's port is not a decimal number from 1 to 65535");
  }
  if (!HostOk(address.substr(0, colon))) {
    return absl::InvalidArgumentError(
        "the address's host is not a DNS name, an IPv4 address or a bracketed IPv6 address (\"[::1]\")");
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
