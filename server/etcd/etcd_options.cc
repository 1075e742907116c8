// Implementation of server/etcd/etcd_options.h.
#include "server/etcd/etcd_options.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace orthoserve::etcd {

absl::StatusOr<EtcdUrl> ParseEtcdUrl(const std::string& url) {
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not etcd://HOST:PORT[,HOST:PORT...]/PREFIX"));
  }
  absl::string_view rest = absl::string_view(url).substr(kScheme.size());
  const size_t slash = rest.find('/');
  EtcdUrl out;
  out.endpoints = std::string(rest.substr(0, slash));
  if (slash != absl::string_view::npos) out.prefix = std::string(rest.substr(slash));
  while (out.prefix.size() > 1 && out.prefix.back() == '/') out.prefix.pop_back();
  if (out.prefix.empty() || out.prefix == "/") {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", url, "\" names no key prefix: give etcd://HOST:PORT/PREFIX (one prefix per fleet, e.g. /orthoserve/prod)"));
  }
  EtcdOptions check;
  check.endpoints = out.endpoints;
  if (absl::StatusOr<std::vector<std::string>> endpoints = ValidateEtcdOptions(check); !endpoints.ok()) {
    return endpoints.status();
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ValidateEtcdOptions(const EtcdOptions& options) {
  std::vector<std::string> endpoints;
  for (absl::string_view part : absl::StrSplit(options.endpoints, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;
    const size_t colon = part.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 || !absl::SimpleAtoi(part.substr(colon + 1), &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoints: \"", part, "\" is not host:port (e.g. 127.0.0.1:2379)"));
    }
    endpoints.emplace_back(part);
  }
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("etcd endpoints: empty; give host:port[,host:port...]");
  }
  if (options.dial_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd dial_timeout must be positive");
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd call_timeout must be positive");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("etcd TLS: give both tls_cert_file and tls_key_file for mutual TLS, or neither");
  }
  if (!options.tls_cert_file.empty() && options.tls_ca_file.empty()) {
    return absl::InvalidArgumentError("etcd TLS: a client certificate needs tls_ca_file too");
  }
  return endpoints;
}

}  // namespace orthoserve::etcd
