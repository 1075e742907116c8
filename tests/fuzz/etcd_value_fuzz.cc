// Fuzz target: what a rank reads from etcd under the fleet's prefix (server/fleet/wire/etcd_values.h):
// a key-value as etcd's responses carry it (mvccpb.KeyValue, converted by server/etcd/kv_convert.h)
// through ParseLeaderKey and ParseMemberKey, and its value through ParseLeaderValue. Input: one
// byte choosing the fleet's world (0: 2^31-1; else the byte), then a serialized mvccpb.KeyValue
// (inputs protobuf does not parse are skipped: the etcd client's gRPC channel refuses them).
// Checks: errors are INVALID_ARGUMENT or FAILED_PRECONDITION with bounded messages; an accepted
// value names a rank inside the world and an address, and its canonical spelling (LeaderValue,
// MemberValue) parses back to the same.
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "etcd/mvccpb/kv.pb.h"
#include "server/etcd/kv_convert.h"
#include "server/fleet/wire/etcd_values.h"
#include "tests/fuzz/fuzz_check.h"

namespace orthoserve::fuzz {
namespace {

constexpr absl::string_view kMembersPrefix = "/fleet/members/";

void CheckLeader(const absl::StatusOr<LeaderInfo>& leader, int64_t term, int world) {
  FUZZ_CHECK_ERROR(leader.status(), absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition);
  if (!leader.ok()) return;
  FUZZ_CHECK(leader->rank >= 0 && leader->rank < world) << leader->rank << " of " << world;
  FUZZ_CHECK(leader->term == term);
  FUZZ_CHECK(!leader->address.empty());
  const absl::StatusOr<LeaderInfo> back = ParseLeaderValue(LeaderValue(leader->rank, leader->address), term, world);
  FUZZ_CHECK(back.ok() && *back == *leader) << back.status();
}

}  // namespace
}  // namespace orthoserve::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orthoserve;         // NOLINT
  using namespace orthoserve::fuzz;  // NOLINT
  if (size < 1) return 0;
  const int world = data[0] == 0 ? std::numeric_limits<int>::max() : data[0];
  mvccpb::KeyValue proto;
  if (!proto.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  const etcd::KeyValue kv = etcd::FromProto(proto);

  CheckLeader(ParseLeaderValue(kv.value, kv.create_revision, world), kv.create_revision, world);
  const absl::StatusOr<LeaderInfo> leader = ParseLeaderKey(kv, world);
  CheckLeader(leader, kv.create_revision, world);
  if (leader.ok()) FUZZ_CHECK(kv.lease != 0);

  const absl::StatusOr<ListedMember> member = ParseMemberKey(kv, kMembersPrefix, world);
  FUZZ_CHECK_ERROR(member.status(), absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition);
  if (!member.ok()) return 0;
  FUZZ_CHECK(kv.lease != 0);
  FUZZ_CHECK(member->rank >= 0 && member->rank < world) << member->rank << " of " << world;
  FUZZ_CHECK(member->incarnation != 0);
  FUZZ_CHECK(kv.key == absl::StrCat(kMembersPrefix, member->rank)) << kv.key;
  etcd::KeyValue canonical = kv;
  canonical.value = MemberValue(member->incarnation, member->address);
  const absl::StatusOr<ListedMember> back = ParseMemberKey(canonical, kMembersPrefix, world);
  FUZZ_CHECK(back.ok() && back->rank == member->rank && back->incarnation == member->incarnation &&
             back->address == member->address)
      << back.status();
  return 0;
}
