// How an EtcdClient reaches etcd: endpoints, timeouts and TLS. Checked once by Validate.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace orthoserve::etcd {

struct EtcdOptions {
  std::string endpoints = "127.0.0.1:2379";        // Comma-separated "host:port" list of cluster members.
  absl::Duration dial_timeout = absl::Seconds(2);  // Most time spent connecting to one endpoint.
  absl::Duration call_timeout = absl::Seconds(5);  // Deadline of a unary call, failover included.
  std::string tls_ca_file;                         // PEM roots; non-empty selects TLS.
  std::string tls_cert_file;                       // PEM client certificate for mutual TLS (with tls_key_file).
  std::string tls_key_file;                        // PEM client private key for mutual TLS (with tls_cert_file).
};

// "etcd://HOST:PORT[,HOST:PORT...]/PREFIX", the fleet's --membership: the cluster's endpoints
// ("HOST:PORT,...", for EtcdOptions::endpoints) and the key prefix ("/PREFIX", no trailing /).
struct EtcdUrl {
  std::string endpoints;
  std::string prefix;
};
// INVALID_ARGUMENT naming what is wrong: another scheme, no endpoint, an endpoint that is not
// "host:port", or an empty prefix.
absl::StatusOr<EtcdUrl> ParseEtcdUrl(const std::string& url);

// The endpoints of `options`, in order, with surrounding spaces removed. INVALID_ARGUMENT (naming
// the field) when the list is empty or an entry is not "host:port", a timeout is not positive,
// or only one of the client certificate and key is given.
absl::StatusOr<std::vector<std::string>> ValidateEtcdOptions(const EtcdOptions& options);

}  // namespace orthoserve::etcd
