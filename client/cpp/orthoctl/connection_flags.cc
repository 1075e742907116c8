// Implementation of client/cpp/orthoctl/connection_flags.h.
#include "client/cpp/orthoctl/connection_flags.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace orthoserve::orthoctl {

void AddConnectionFlags(FlagSet* flags, ConnectionFlagValues* v) {
  flags->AddString("server", "HOST:PORT[,HOST:PORT...]",
                   "server address, or several separated by commas, tried in turn when one fails (default "
                   "127.0.0.1:50051)",
                   &v->server);
  flags->AddDouble("timeout", "SECONDS",
                   "deadline of each attempt of a call; an attempt that runs out of it is retried (default 90)",
                   &v->timeout_seconds);
  flags->AddString("token-file", "PATH", "file holding a bearer token, sent as \"authorization: Bearer ...\"",
                   &v->token_file);
  flags->AddString("tls-ca", "PATH", "PEM root certificates; enables TLS", &v->tls_ca);
  flags->AddString("tls-cert", "PATH", "PEM client certificate for mutual TLS (with --tls-key)", &v->tls_cert);
  flags->AddString("tls-key", "PATH", "PEM client private key for mutual TLS (with --tls-cert)", &v->tls_key);
  flags->AddString("tls-server-name", "NAME", "name to check in the server certificate (default: the host)",
                   &v->tls_server_name);
}

void AddRetryFlags(FlagSet* flags, ConnectionFlagValues* v) {
  flags->AddBool("no-retry",
                 "make one attempt; by default a call that fails with UNAVAILABLE (or ABORTED by a fleet change, "
                 "or runs out of --timeout) is retried with backoff, at the next --server address if there is one",
                 &v->no_retry);
  flags->AddDouble("retry-deadline", "SECONDS",
                   "give up retrying a call after this long, all attempts together (default 120)",
                   &v->retry_deadline_seconds);
}

absl::StatusOr<std::vector<std::string>> ServerAddresses(const std::string& server) {
  // gRPC's ipv4: and ipv6: target schemes list addresses with commas themselves.
  if (absl::StartsWith(server, "ipv4:") || absl::StartsWith(server, "ipv6:")) return std::vector<std::string>{server};
  std::vector<std::string> addresses = absl::StrSplit(server, ',');
  for (std::string& address : addresses) {
    address = std::string(absl::StripAsciiWhitespace(address));
    if (address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--server \"", server,
                                                     "\" has an empty address; give HOST:PORT, "
                                                     "or several separated by commas"));
    }
  }
  return addresses;
}

absl::StatusOr<client::ClientOptions> ClientOptionsFromFlags(const ConnectionFlagValues& v) {
  client::ClientOptions o;
  ASSIGN_OR_RETURN(o.addresses, ServerAddresses(v.server));
  o.address = o.addresses.front();
  if (!(v.timeout_seconds > 0) || !std::isfinite(v.timeout_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be a positive number of seconds, got ", v.timeout_seconds));
  }
  o.timeout = absl::Seconds(v.timeout_seconds);
  if (!(v.retry_deadline_seconds > 0) || !std::isfinite(v.retry_deadline_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--retry-deadline must be a positive number of seconds, got ", v.retry_deadline_seconds));
  }
  o.retry.enabled = !v.no_retry;
  o.retry.deadline = absl::Seconds(v.retry_deadline_seconds);
  o.tls_ca_file = v.tls_ca;
  o.tls_cert_file = v.tls_cert;
  o.tls_key_file = v.tls_key;
  o.tls_server_name = v.tls_server_name;
  if (!v.token_file.empty()) {
    std::ifstream in(v.token_file, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open --token-file ", v.token_file));
    std::ostringstream text;
    text << in.rdbuf();
    o.bearer_token = std::string(absl::StripAsciiWhitespace(text.str()));
    if (o.bearer_token.empty())
      return absl::InvalidArgumentError(absl::StrCat("--token-file ", v.token_file, " is empty"));
  }
  return o;
}

}  // namespace orthoserve::orthoctl
