// TLS credentials whose PEM files gRPC reads again every interval (its
// FileWatcherCertificateProvider), for the public port (--tls-*) and the fleet port
// (--fleet-tls-*): new handshakes use what the files hold at the last read, connections already
// made keep theirs, and a certificate whose key does not match it is not taken (the last good
// pair stays). So certificates renewed in place (cert-manager renews the Secret, the kubelet
// updates the mount) take effect without a restart. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"

namespace orthoserve {

struct WatchedTlsFiles {
  std::string key_file;   // PEM private key of cert_file.
  std::string cert_file;  // PEM certificate chain presented.
  std::string ca_file;    // PEM CA bundle that peers' certificates must chain to; empty: none.
  absl::Duration reload_interval = absl::Seconds(60);  // How often the files are read; at least 1 s.
};

// A provider of `files`, shared by the credentials built on it. The files are read in the
// background; a file that cannot be read or parsed leaves the last good contents in use (gRPC
// logs why). The caller checks the files exist before.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> WatchTlsFiles(const WatchedTlsFiles& files);

// Server credentials presenting the provider's certificate; with `require_client_certificate`
// clients must present one that chains to the provider's CA bundle (mutual TLS), else none is
// asked for.
std::shared_ptr<grpc::ServerCredentials> WatchedServerCredentials(
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider, bool require_client_certificate);

// Channel credentials that trust the provider's CA bundle, present its certificate as the
// client's, and check that the server's certificate names the channel's target (or its
// GRPC_SSL_TARGET_NAME_OVERRIDE_ARG).
std::shared_ptr<grpc::ChannelCredentials> WatchedChannelCredentials(
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider);

}  // namespace orthoserve
