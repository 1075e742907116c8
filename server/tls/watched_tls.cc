// Implementation of server/tls/watched_tls.h.
#include "server/tls/watched_tls.h"

#include <algorithm>
#include <utility>

#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace orthoserve {

std::shared_ptr<grpc::experimental::CertificateProviderInterface> WatchTlsFiles(const WatchedTlsFiles& files) {
  const int64_t seconds = std::max<int64_t>(absl::ToInt64Seconds(files.reload_interval), 1);
  if (files.ca_file.empty()) {
    return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.key_file, files.cert_file, static_cast<unsigned int>(seconds));
  }
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, static_cast<unsigned int>(seconds));
}

std::shared_ptr<grpc::ServerCredentials> WatchedServerCredentials(
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider, bool require_client_certificate) {
  grpc::experimental::TlsServerCredentialsOptions tls(std::move(provider));
  tls.watch_identity_key_cert_pairs();
  if (require_client_certificate) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

std::shared_ptr<grpc::ChannelCredentials> WatchedChannelCredentials(
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider) {
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(std::move(provider));
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(tls);
}

}  // namespace orthoserve
