// Implementation of server/fleet/logic/fleet_identity.h.
#include "server/fleet/logic/fleet_identity.h"

#include <algorithm>
#include <functional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace orthoserve {
namespace {

// A DNS name as compared: lower case, without a trailing dot.
std::string DnsKey(absl::string_view name) {
  if (absl::EndsWith(name, ".")) name.remove_suffix(1);
  return absl::AsciiStrToLower(name);
}

// For a wildcard DNS SAN "*.rest" with at least two labels in "rest": true and rest's DnsKey.
bool WildcardParent(absl::string_view san, std::string* parent) {
  if (!absl::StartsWith(san, "*.")) return false;
  *parent = DnsKey(san.substr(2));
  const size_t dot = parent->find('.');
  return dot != std::string::npos && dot > 0 && dot + 1 < parent->size();
}

void AddRanks(const std::vector<int>* ranks, std::vector<int>& out) {
  if (ranks != nullptr) out.insert(out.end(), ranks->begin(), ranks->end());
}

template <typename Map>
const std::vector<int>* Find(const Map& map, const std::string& key) {
  auto it = map.find(key);
  return it == map.end() ? nullptr : &it->second;
}

}  // namespace

absl::StatusOr<FleetMemberNames> FleetMemberNames::Create(absl::string_view pattern, int world) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("--world = ", world, " must be >= 1"));
  if (pattern.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fleet-tls-member-name is empty; give the name fleet rank r's "
                     "certificate carries, with {rank} for r (default \"",
                     kDefaultFleetMemberName, "\")"));
  }
  for (char c : pattern) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '*' ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat("--fleet-tls-member-name \"", pattern,
                                                     "\" has whitespace, a control character or '*': give a DNS name "
                                                     "with {rank} for the rank"));
    }
  }
  if (absl::StrContains(pattern, ':')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fleet-tls-member-name \"", pattern,
        "\" is not a DNS name (a URI?): members are named by DNS SANs, since gRPC checks the certificate of the "
        "rank a channel dials against DNS names only"));
  }
  if (const std::string rest = absl::StrReplaceAll(pattern, {{kFleetRankPlaceholder, ""}});
      absl::StrContains(rest, '{') || absl::StrContains(rest, '}')) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fleet-tls-member-name \"", pattern, "\" has a brace outside {rank}, the only placeholder"));
  }
  FleetMemberNames names;
  names.pattern_ = std::string(pattern);
  names.per_rank_ = absl::StrContains(pattern, kFleetRankPlaceholder);
  names.names_.reserve(world);
  for (int r = 0; r < world; ++r) {
    std::string name = absl::StrReplaceAll(pattern, {{kFleetRankPlaceholder, absl::StrCat(r)}});
    const std::string dns = DnsKey(name);
    names.by_dns_[dns].push_back(r);
    if (const size_t dot = dns.find('.'); dot != std::string::npos && dot > 0) {
      names.by_parent_[dns.substr(dot + 1)].push_back(r);
    }
    names.names_.push_back(std::move(name));
  }
  return names;
}

absl::StatusOr<std::string> FleetMemberNames::NameOf(int rank) const {
  if (rank < 0 || rank >= world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet rank ", rank, " has no member name: it is outside this fleet of ", world(), " ranks"));
  }
  return names_[rank];
}

std::vector<int> FleetMemberNames::RanksNamed(const CertificateNames& names) const {
  std::vector<int> ranks;
  for (const std::string& san : names.dns) {
    std::string parent;
    if (absl::StartsWith(san, "*")) {
      if (WildcardParent(san, &parent)) AddRanks(Find(by_parent_, parent), ranks);
    } else if (!san.empty()) {
      AddRanks(Find(by_dns_, DnsKey(san)), ranks);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

bool FleetMemberNames::Names(const CertificateNames& names, int rank) const {
  if (rank < 0 || rank >= world()) return false;
  // The maps' rank lists are ascending (filled in rank order).
  return Matches(
      names, [rank](const std::vector<int>& ranks) { return std::binary_search(ranks.begin(), ranks.end(), rank); });
}

bool FleetMemberNames::NamesAnyMember(const CertificateNames& names) const {
  return Matches(names, [](const std::vector<int>&) { return true; });
}

bool FleetMemberNames::Matches(const CertificateNames& names,
                               const std::function<bool(const std::vector<int>&)>& accept) const {
  auto found = [&accept](const std::vector<int>* ranks) { return ranks != nullptr && accept(*ranks); };
  for (const std::string& san : names.dns) {
    std::string parent;
    if (absl::StartsWith(san, "*")) {
      if (WildcardParent(san, &parent) && found(Find(by_parent_, parent))) return true;
    } else if (!san.empty() && found(Find(by_dns_, DnsKey(san)))) {
      return true;
    }
  }
  return false;
}

std::string DescribeRanks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no fleet member";
  if (ranks.size() == 1) return absl::StrCat("rank ", ranks[0]);
  if (ranks.size() > 2 && ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size())) {
    return absl::StrCat("ranks ", ranks.front(), " to ", ranks.back());
  }
  constexpr size_t kListed = 8;
  const size_t listed = std::min(ranks.size(), kListed);
  std::string out = absl::StrCat(
      "ranks ", absl::StrJoin(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(listed - 1), ", "));
  if (ranks.size() > kListed) {
    return absl::StrCat(out, ", ", ranks[listed - 1], " and ", ranks.size() - listed, " more");
  }
  return absl::StrCat(out, " and ", ranks[listed - 1]);
}

}  // namespace orthoserve
