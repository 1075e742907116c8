// The connection flags every orthoctl subcommand takes (--server, --timeout, --token-file,
// --tls-ca, --tls-cert, --tls-key, --tls-server-name), the retry flags of the subcommands that
// retry (--no-retry, --retry-deadline), and the ClientOptions they make.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "client/cpp/orthoctl/flags.h"

namespace orthoserve::orthoctl {

struct ConnectionFlagValues {
  std::string server = "127.0.0.1:50051";
  double timeout_seconds = 90;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  bool no_retry = false;                // Retries are on unless --no-retry.
  double retry_deadline_seconds = 120;  // All attempts of one call together.
};

void AddConnectionFlags(FlagSet* flags, ConnectionFlagValues* values);

// --no-retry and --retry-deadline (info, orthogonalize, bench; health never retries).
void AddRetryFlags(FlagSet* flags, ConnectionFlagValues* values);

// --server's addresses: split at commas (surrounding blanks dropped), except a gRPC ipv4:/ipv6:
// target, whose commas are its own. INVALID_ARGUMENT for an empty address.
absl::StatusOr<std::vector<std::string>> ServerAddresses(const std::string& server);

// The client's addresses are ServerAddresses(--server). INVALID_ARGUMENT for a bad --server, a
// non-positive timeout or retry deadline; NOT_FOUND when the token file
// cannot be read, INVALID_ARGUMENT when it is empty. The token is the file's content without
// surrounding whitespace. Retries keep RetryOptions' defaults but for `enabled` and `deadline`.
absl::StatusOr<client::ClientOptions> ClientOptionsFromFlags(const ConnectionFlagValues& values);

}  // namespace orthoserve::orthoctl
