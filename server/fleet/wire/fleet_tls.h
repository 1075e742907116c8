// The fleet port's mutual TLS over gRPC (docs/operations.md, "Security"): the credentials of
// the fleet server and of the channels to it, and the verified peer certificate's names. Which
// ranks those names are is server/fleet/logic/fleet_identity.h's business; who may make which call,
// server/fleet/wire/fleet_access.h's.
//
// With fleet TLS every member presents its certificate (signed by the fleet CA) both ways: the
// fleet server requires and verifies the client's, and each channel checks that the server it
// dials carries the member name of the rank it means to reach (rank 0 for the coordinator, the
// forwarding target for peer compute), so a rank cannot be talked into serving an impostor.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/support/channel_arguments.h"
#include "server/fleet/logic/fleet_identity.h"

namespace orthoserve {

// What --fleet-tls-* give. All three files or none.
struct FleetTlsOptions {
  std::string cert_file;  // --fleet-tls-cert: this rank's PEM certificate chain.
  std::string key_file;   // --fleet-tls-key: its PEM private key.
  std::string ca_file;    // --fleet-tls-ca: the PEM CA bundle every member's certificate is signed by.
  std::string member_name = kDefaultFleetMemberName;  // --fleet-tls-member-name ({rank}: the rank).
  absl::Duration reload_interval = absl::Seconds(60);  // --tls-reload-interval: how often the files are read.

  // Any of the files is given (Load then requires all three).
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// This rank's fleet credentials. The three files are checked once by Load, then read again every
// reload_interval (server/tls/watched_tls.h): the fleet server's new handshakes present the
// certificate they hold and trust the CA bundle they hold, and so do the channels' new
// connections; connections already made keep theirs. Thread-safe.
class FleetTls {
 public:
  // Reads the three files and checks the member-name pattern for a fleet of `world` ranks.
  // INVALID_ARGUMENT naming the flag: a file missing from the three, unreadable or without the
  // PEM block it must hold, a bad pattern, or a reload interval under 1 s. Certificates are not
  // verified here: a certificate the CA did not sign fails every handshake, and so does a key
  // that does not fit its certificate (gRPC does not take the pair; it logs why).
  // The files are not held: the credentials read them again (a later file that does not parse
  // leaves the last good one in use).
  static absl::StatusOr<std::shared_ptr<const FleetTls>> Load(const FleetTlsOptions& options, int world);

  const FleetMemberNames& names() const { return names_; }

  // The fleet server's: this rank's certificate, and the client's required and verified
  // against the fleet CA (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // A channel's: the fleet CA as roots and this rank's certificate as the client's.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // Makes a channel built with `args` check that the server carries fleet rank `rank`'s member
  // name (GRPC_SSL_TARGET_NAME_OVERRIDE_ARG). INVALID_ARGUMENT for a rank outside [0, world)
  // (`args` untouched).
  absl::Status ExpectServerRank(int rank, grpc::ChannelArguments& args) const;

 private:
  FleetTls(std::shared_ptr<grpc::experimental::CertificateProviderInterface> files, FleetMemberNames names)
      : files_(std::move(files)), names_(std::move(names)) {}

  // The three files, read again every reload_interval; shared by every credential built here.
  const std::shared_ptr<grpc::experimental::CertificateProviderInterface> files_;
  const FleetMemberNames names_;
};

// The DNS and URI subject alternative names of the certificate a call's peer presented and the
// TLS stack verified (gRPC's peer_dns and peer_uri properties); empty names for a call without
// one (plaintext, or TLS without a client certificate).
CertificateNames PeerCertificateNames(const grpc::AuthContext& auth);

// "DNS:a, URI:b" (bounded), or "no subject alternative names": for refusals and logs.
std::string DescribeCertificateNames(const CertificateNames& names);

}  // namespace orthoserve
