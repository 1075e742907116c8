// Implementation of server/etcd/etcd_options.h.
#include "server/etcd/etcd_options.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace orthoserve::etcd {

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
