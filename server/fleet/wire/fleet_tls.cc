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
#include "server/tls/watched_tls.h"

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
  RETURN_IF_ERROR(ReadPem(o.cert_file, "--fleet-tls-cert", "CERTIFICATE").status());
  RETURN_IF_ERROR(ReadPem(o.key_file, "--fleet-tls-key", "PRIVATE KEY").status());
  RETURN_IF_ERROR(ReadPem(o.ca_file, "--fleet-tls-ca", "CERTIFICATE").status());
  if (o.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls-reload-interval must be at least 1s");
  }
  ASSIGN_OR_RETURN(FleetMemberNames names, FleetMemberNames::Create(o.member_name, world));
  return std::shared_ptr<const FleetTls>(
      new FleetTls(WatchTlsFiles({o.key_file, o.cert_file, o.ca_file, o.reload_interval}), std::move(names)));
}

std::shared_ptr<grpc::ServerCredentials> FleetTls::ServerCredentials() const {
  return WatchedServerCredentials(files_, /*require_client_certificate=*/true);
}

std::shared_ptr<grpc::ChannelCredentials> FleetTls::ChannelCredentials() const {
  return WatchedChannelCredentials(files_);
}

absl::Status FleetTls::ExpectServerRank(int rank, grpc::ChannelArguments& args) const {
  ASSIGN_OR_RETURN(const std::string name, names_.NameOf(rank));
  args.SetSslTargetNameOverride(name);
  return absl::OkStatus();
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
