// What the fleet keeps in etcd under its prefix (--membership etcd://HOSTS/PREFIX), and the checks
// every value passes before a rank uses it (docs/operations.md, "What a rank reads from etcd").
// etcd's content is input: whoever may write the prefix writes it — a rank of another release, a
// rank of the same fleet with another --world during a resize, an operator's etcdctl, an
// attacker. A value that fails is refused: a leader key that fails names no coordinator, a
// liveness key that fails lists nobody.
//
//  - PREFIX/coordinator/<lease id in hex>: a candidate in the election of the fleet's
//    coordinator (etcd's Election service writes these keys, each on its campaigner's lease);
//    the one of lowest create revision leads, and that revision is its term. Value: "<rank>
//    <fleet address>" (LeaderValue).
//  - PREFIX/members/<rank>: a rank's liveness key, on a lease of its own. Value: "<incarnation>
//    <fleet address>" (MemberValue).
//
// The parse functions are pure (no etcd, no clock, no log), for tests and fuzzers.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/etcd/etcd_types.h"

namespace orthoserve {

// The coordinator etcd names: its term (the leader key's create revision), fleet rank and fleet
// address. Rank -1 (and no address): etcd names a leader key no rank can use, so nobody
// coordinates in that term.
struct LeaderInfo {
  int64_t term = 0;
  int rank = -1;
  std::string address;
  bool operator==(const LeaderInfo& o) const { return term == o.term && rank == o.rank && address == o.address; }
};

// "<rank> <address>", the value a rank campaigns with.
std::string LeaderValue(int rank, absl::string_view address);
// The leader `value` names in term `term`, for a fleet of `world` ranks. INVALID_ARGUMENT
// unless `value` is "<rank> <address>": the rank in decimal digits (no sign, no leading zero)
// below `world`, one space, and an address CheckHostPort (server/fleet/logic/address.h) takes.
absl::StatusOr<LeaderInfo> ParseLeaderValue(absl::string_view value, int64_t term, int world);
// The election's leader key as etcd gives it: its value (ParseLeaderValue) in the term of its
// create revision. Also FAILED_PRECONDITION for a key on no lease: etcd's Election service puts
// every candidate's key on its campaigner's lease, so such a key was written by something else,
// and it would lead for as long as it stays.
absl::StatusOr<LeaderInfo> ParseLeaderKey(const etcd::KeyValue& kv, int world);

// A rank's liveness key.
struct ListedMember {
  int rank = -1;
  uint64_t incarnation = 0;
  std::string address;
};

// "<incarnation> <address>", the value of a rank's liveness key.
std::string MemberValue(uint64_t incarnation, absl::string_view address);
// The rank a liveness key lists, for a fleet of `world` ranks. INVALID_ARGUMENT unless the key
// is `members_prefix` followed by the rank in decimal digits (no sign, no leading zero) below
// `world`, and the value is "<incarnation> <address>": a non-zero decimal incarnation, one
// space, an address CheckHostPort takes. FAILED_PRECONDITION for a key on no lease (it would
// list its rank after the rank is gone).
absl::StatusOr<ListedMember> ParseMemberKey(const etcd::KeyValue& kv, absl::string_view members_prefix, int world);

// Which etcd values a rank has refused, so that each is counted once and logged when first seen,
// then at most once per `interval` for as long as it stays. A value is a key at one mod revision
// (a key written again is a new value). Not thread-safe.
class EtcdRefusals {
 public:
  explicit EtcdRefusals(absl::Duration interval) : interval_(interval) {}

  enum class Seen {
    kNew,    // Not refused before: count it and log it.
    kAgain,  // Refused before, and last logged `interval` ago or more: log that it stays.
    kQuiet,  // Refused before, and logged lately.
  };
  // Records that `kv` is refused at `now`.
  Seen Refuse(const etcd::KeyValue& kv, absl::Time now);
  // Forgets the keys not in `present` (after a read of what etcd holds), so that the record
  // never outgrows etcd's content.
  void Retain(const absl::flat_hash_set<std::string>& present);
  size_t size() const { return refused_.size(); }

 private:
  struct Refused {
    int64_t mod_revision = 0;
    absl::Time logged;
  };
  const absl::Duration interval_;
  absl::flat_hash_map<std::string, Refused> refused_;  // By key.
};

}  // namespace orthoserve
