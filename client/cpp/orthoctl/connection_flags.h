// The connection flags every orthoctl subcommand takes (--server, --timeout, --token-file,
// --tls-ca, --tls-cert, --tls-key, --tls-server-name) and the ClientOptions they make.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "client/cpp/orthoctl/flags.h"

namespace orthoserve::orthoctl {

struct ConnectionFlagValues {
  std::string server = "127.0.0.1:50051";
  double timeout_seconds = 60;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
};

void AddConnectionFlags(FlagSet* flags, ConnectionFlagValues* values);

// INVALID_ARGUMENT for a non-positive timeout; NOT_FOUND when the token file cannot be read,
// INVALID_ARGUMENT when it is empty. The token is the file's content without surrounding whitespace.
absl::StatusOr<client::ClientOptions> ClientOptionsFromFlags(const ConnectionFlagValues& values);

}  // namespace orthoserve::orthoctl
