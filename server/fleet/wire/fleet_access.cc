// Implementation of server/fleet/wire/fleet_access.h.
#include "server/fleet/wire/fleet_access.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace orthoserve {
namespace {

// Refusals are logged at most this often.
constexpr absl::Duration kLogEvery = absl::Seconds(10);

}  // namespace

CertificateNames FleetAccess::NamesOf(const grpc::ServerContextBase& context) const {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return auth == nullptr ? CertificateNames{} : PeerCertificateNames(*auth);
}

absl::Status FleetAccess::Refuse(absl::string_view call, const std::string& why) const {
  if (metrics_ != nullptr) metrics_->IntegrityRefused("not_a_member");
  const std::string message = absl::StrCat("fleet call ", call, " refused: ", why);
  {
    absl::MutexLock lock(&log_mu_);
    const absl::Time now = absl::Now();
    if (now - last_logged_ >= kLogEvery) {
      LOG_WARNING("fleet") << message
                           << (unlogged_ > 0 ? absl::StrCat(" (and ", unlogged_, " refusals since the last logged)")
                                             : std::string());
      last_logged_ = now;
      unlogged_ = 0;
    } else {
      ++unlogged_;
    }
  }
  return absl::PermissionDeniedError(message);
}

absl::Status FleetAccess::RequireRank(const grpc::ServerContextBase& context, absl::string_view call, int rank) const {
  if (tls_ == nullptr) return absl::OkStatus();
  const CertificateNames names = NamesOf(context);
  const FleetMemberNames& members = tls_->names();
  if (members.Names(names, rank)) return absl::OkStatus();
  const std::vector<int> named = members.RanksNamed(names);
  const absl::StatusOr<std::string> name = members.NameOf(rank);
  const std::string claimed = name.ok() ? absl::StrCat("rank ", rank, " (\"", *name, "\")")
                                        : absl::StrCat("rank ", rank, ", which is out of range");
  return Refuse(call, absl::StrCat("the caller claims fleet ", claimed, " but its certificate names ",
                                   DescribeRanks(named), " (", DescribeCertificateNames(names), ")"));
}

absl::Status FleetAccess::RequireMember(const grpc::ServerContextBase& context, absl::string_view call) const {
  if (tls_ == nullptr) return absl::OkStatus();
  const CertificateNames names = NamesOf(context);
  if (tls_->names().NamesAnyMember(names)) return absl::OkStatus();
  return Refuse(call, absl::StrCat("the caller's certificate names no fleet member (", DescribeCertificateNames(names),
                                   "; members are named \"", tls_->names().pattern(), "\")"));
}

}  // namespace orthoserve
