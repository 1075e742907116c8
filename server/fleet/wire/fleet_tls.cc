// Implementation of server/fleet/wire/fleet_tls.h.
#include "server/fleet/wire/fleet_tls.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/message_text.h"
#include "common/status.h"
#include "grpc/grpc_security_constants.h"

namespace orthoserve {
namespace {

// The file `path` of flag `flag`, which must hold a PEM block whose label contains `label`.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag, absl::string_view label) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  const size_t begin = pem.find("-----BEGIN ");
  const size_t end = begin == std::string::npos ? std::string::npos : pem.find("-----", begin + 11);
  if (end == std::string::npos || !absl::StrContains(pem.substr(begin, end - begin), label)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " holds no PEM ", label, " (\"-----BEGIN ...", label, "-----\")"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const FleetTls>> FleetTls::Load(const FleetTlsOptions& o, int world) {
  std::vector<std::string> missing;
  if (o.cert_file.empty()) missing.push_back("--fleet-tls-cert");
  if (o.key_file.empty()) missing.push_back("--fleet-tls-key");
  if (o.ca_file.empty()) missing.push_back("--fleet-tls-ca");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca are given together or not at all; missing: ",
                     absl::StrJoin(missing, ", ")));
  }
  ASSIGN_OR_RETURN(std::string cert, ReadPem(o.cert_file, "--fleet-tls-cert", "CERTIFICATE"));
  ASSIGN_OR_RETURN(std::string key, ReadPem(o.key_file, "--fleet-tls-key", "PRIVATE KEY"));
  ASSIGN_OR_RETURN(std::string ca, ReadPem(o.ca_file, "--fleet-tls-ca", "CERTIFICATE"));
  ASSIGN_OR_RETURN(FleetMemberNames names, FleetMemberNames::Create(o.member_name, world));
  return std::shared_ptr<const FleetTls>(
      new FleetTls(std::move(cert), std::move(key), std::move(ca), std::move(names)));
}

std::shared_ptr<grpc::ServerCredentials> FleetTls::ServerCredentials() const {
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = ca_;
  ssl.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(ssl);
}

std::shared_ptr<grpc::ChannelCredentials> FleetTls::ChannelCredentials() const {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_;
  ssl.pem_private_key = key_;
  ssl.pem_cert_chain = cert_;
  return grpc::SslCredentials(ssl);
}

void FleetTls::ExpectServerRank(int rank, grpc::ChannelArguments& args) const {
  args.SetSslTargetNameOverride(names_.NameOf(rank));
}

CertificateNames PeerCertificateNames(const grpc::AuthContext& auth) {
  CertificateNames names;
  if (!auth.IsPeerAuthenticated()) return names;
  for (const grpc::string_ref& v : auth.FindPropertyValues(GRPC_PEER_DNS_PROPERTY_NAME)) {
    names.dns.emplace_back(v.data(), v.size());
  }
  for (const grpc::string_ref& v : auth.FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
    names.uri.emplace_back(v.data(), v.size());
  }
  return names;
}

std::string DescribeCertificateNames(const CertificateNames& names) {
  if (names.dns.empty() && names.uri.empty()) return "no subject alternative names";
  std::vector<std::string> all;
  for (const std::string& n : names.dns) all.push_back(absl::StrCat("DNS:", n));
  for (const std::string& n : names.uri) all.push_back(absl::StrCat("URI:", n));
  return BoundedText(absl::StrJoin(all, ", "));
}

}  // namespace orthoserve
