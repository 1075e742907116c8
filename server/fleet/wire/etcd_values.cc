// Implementation of server/fleet/wire/etcd_values.h.
#include "server/fleet/wire/etcd_values.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "server/fleet/logic/address.h"

namespace orthoserve {
namespace {

// What a message repeats of a value read from etcd: bounded, control bytes escaped.
std::string Shown(absl::string_view text) { return absl::CHexEscape(BoundedText(text, 100)); }

// `text` as a decimal number of at most `max`: digits only, no sign, no leading zero (so that
// one number has one spelling, and "01" cannot stand beside "1").
bool Decimal(absl::string_view text, uint64_t max, uint64_t* value) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text.front() == '0')) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, value) && *value <= max;
}

// "<number> <address>" split at its one space; false when it has none or the address fails.
bool SplitValue(absl::string_view value, absl::string_view* number, absl::string_view* address, absl::Status* why) {
  const size_t space = value.find(' ');
  if (space == absl::string_view::npos) {
    *why = absl::InvalidArgumentError("it has no space between the number and the address");
    return false;
  }
  *number = value.substr(0, space);
  *address = value.substr(space + 1);
  *why = CheckHostPort(*address);
  return why->ok();
}

}  // namespace

std::string LeaderValue(int rank, absl::string_view address) { return absl::StrCat(rank, " ", address); }

absl::StatusOr<LeaderInfo> ParseLeaderValue(absl::string_view value, int64_t term, int world) {
  absl::string_view number, address;
  absl::Status why;
  uint64_t rank = 0;
  if (SplitValue(value, &number, &address, &why) && !Decimal(number, std::numeric_limits<int>::max(), &rank)) {
    why = absl::InvalidArgumentError("its rank is not a decimal number");
  }
  if (why.ok() && (world < 1 || rank >= static_cast<uint64_t>(world))) {
    why = absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside this fleet of ", world,
                                                  " ranks (--world; another --world during a resize?)"));
  }
  if (!why.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the fleet's leader key holds \"", Shown(value),
                                                   "\", not \"<rank> <fleet address>\": ", why.message()));
  }
  LeaderInfo info;
  info.term = term;
  info.rank = static_cast<int>(rank);
  info.address = std::string(address);
  return info;
}

absl::StatusOr<LeaderInfo> ParseLeaderKey(const etcd::KeyValue& kv, int world) {
  if (kv.lease == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the fleet's leader key ", Shown(kv.key),
                     " is on no lease: no candidate wrote it (each campaigns on a lease), and it would lead for as "
                     "long as it stays"));
  }
  return ParseLeaderValue(kv.value, kv.create_revision, world);
}

std::string MemberValue(uint64_t incarnation, absl::string_view address) {
  return absl::StrCat(incarnation, " ", address);
}

absl::StatusOr<ListedMember> ParseMemberKey(const etcd::KeyValue& kv, absl::string_view members_prefix, int world) {
  uint64_t rank = 0;
  if (!absl::StartsWith(kv.key, members_prefix) ||
      !Decimal(absl::string_view(kv.key).substr(members_prefix.size()), std::numeric_limits<int>::max(), &rank) ||
      world < 1 || rank >= static_cast<uint64_t>(world)) {
    return absl::InvalidArgumentError(absl::StrCat("etcd key ", Shown(kv.key), " is not the liveness key of a rank of ",
                                                   "this fleet of ", world, " ranks (", members_prefix, "<rank>)"));
  }
  absl::string_view number, address;
  absl::Status why;
  uint64_t incarnation = 0;
  if (SplitValue(kv.value, &number, &address, &why) &&
      (!Decimal(number, std::numeric_limits<uint64_t>::max(), &incarnation) || incarnation == 0)) {
    why = absl::InvalidArgumentError("its incarnation is not a non-zero decimal number");
  }
  if (!why.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the liveness key ", Shown(kv.key), " holds \"", Shown(kv.value),
                                                   "\", not \"<incarnation> <fleet address>\": ", why.message()));
  }
  if (kv.lease == 0) {
    return absl::FailedPreconditionError(absl::StrCat("the liveness key ", Shown(kv.key),
                                                      " is on no lease: it would list its rank after the rank is gone"));
  }
  ListedMember member;
  member.rank = static_cast<int>(rank);
  member.incarnation = incarnation;
  member.address = std::string(address);
  return member;
}

EtcdRefusals::Seen EtcdRefusals::Refuse(const etcd::KeyValue& kv, absl::Time now) {
  auto [it, fresh] = refused_.try_emplace(kv.key);
  Refused& r = it->second;
  if (fresh || r.mod_revision != kv.mod_revision) {
    r.mod_revision = kv.mod_revision;
    r.logged = now;
    return Seen::kNew;
  }
  if (now - r.logged < interval_) return Seen::kQuiet;
  r.logged = now;
  return Seen::kAgain;
}

void EtcdRefusals::Retain(const absl::flat_hash_set<std::string>& present) {
  absl::erase_if(refused_, [&present](const auto& entry) { return !present.contains(entry.first); });
}

}  // namespace orthoserve
