// Which fleet ranks a verified peer certificate names: the identity half of the fleet port's
// mutual TLS (server/fleet/wire/fleet_tls.h carries it over gRPC). No gRPC, no OpenSSL: it works on
// the subject alternative names that the TLS stack has already verified against the fleet CA.
//
// Fleet rank r's member name is the pattern (--fleet-tls-member-name) with every "{rank}"
// replaced by r: "orthoserve-rank-{rank}" names rank 1 "orthoserve-rank-1". Member names are
// DNS names. A certificate names rank r when one of its DNS SANs is r's member name: equal to it
// (ASCII case-insensitive, a trailing dot ignored), or a wildcard "*.rest" where the member name
// is one non-empty label followed by ".rest" (the wildcard covers exactly the leftmost label, as
// RFC 6125 and gRPC's own host check have it; "rest" must have at least two labels, so "*.svc"
// covers nothing). URI SANs (SPIFFE ids) name no member: gRPC 1.51 checks the server a channel
// dials against DNS SANs only (tests/unit/fleet/fleet_tls_test.cc shows it), so a rank could not
// verify a member named by a URI, and a pattern with a ':' is refused.
// A pattern without "{rank}" is one fleet-wide name: a certificate that carries it names every
// rank, so any holder of such a certificate can claim any rank. That is weaker than per-rank
// names and meant for one shared certificate (docs/operations.md, "Security").
// Common names are never read: a certificate without SANs names no member.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoserve {

// The default --fleet-tls-member-name.
inline constexpr char kDefaultFleetMemberName[] = "orthoserve-rank-{rank}";
// What a pattern's rank placeholder looks like.
inline constexpr char kFleetRankPlaceholder[] = "{rank}";

// The subject alternative names of a verified certificate, by type (others are not read). Only
// the DNS names can name a member; the URIs are there to be shown in refusals.
struct CertificateNames {
  std::vector<std::string> dns;
  std::vector<std::string> uri;
};

// The member names of a fleet of `world` ranks. Immutable after Create; thread-safe.
class FleetMemberNames {
 public:
  // INVALID_ARGUMENT (naming --fleet-tls-member-name) for an empty pattern, one with whitespace,
  // a control character, '*', ':' (a URI) or a brace outside "{rank}", or a `world` < 1.
  static absl::StatusOr<FleetMemberNames> Create(absl::string_view pattern, int world);

  int world() const { return static_cast<int>(names_.size()); }
  // Whether each rank has a name of its own (the pattern has "{rank}").
  bool per_rank() const { return per_rank_; }
  const std::string& pattern() const { return pattern_; }
  // Rank r's member name. INVALID_ARGUMENT for a rank outside [0, world()) (a rank read from
  // etcd or from another rank's message may be anything).
  absl::StatusOr<std::string> NameOf(int rank) const;

  // The ranks `names` names, ascending and without repeats; empty when it names no member.
  std::vector<int> RanksNamed(const CertificateNames& names) const;
  // Whether `names` names `rank` (false for a rank out of range).
  bool Names(const CertificateNames& names, int rank) const;
  // Whether `names` names at least one rank (RanksNamed is not empty), without listing them.
  bool NamesAnyMember(const CertificateNames& names) const;

 private:
  FleetMemberNames() = default;
  // Whether some DNS SAN of `names` is the member name of ranks that `accept` takes (the ranks
  // it is the name of, ascending).
  bool Matches(const CertificateNames& names, const std::function<bool(const std::vector<int>&)>& accept) const;

  std::string pattern_;
  bool per_rank_ = false;
  std::vector<std::string> names_;  // By rank, as the pattern gives them.
  // Lower-cased DNS form (no trailing dot) of each member name → its ranks (all of them for a
  // fleet-wide name); and the part after the first label → the ranks a wildcard SAN covers.
  absl::flat_hash_map<std::string, std::vector<int>> by_dns_;
  absl::flat_hash_map<std::string, std::vector<int>> by_parent_;
};

// "rank 2", "ranks 0, 1 and 3", "ranks 0 to 63", "no fleet member": ranks for a refusal's message.
std::string DescribeRanks(const std::vector<int>& ranks);

}  // namespace orthoserve
