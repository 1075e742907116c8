// Argument checks and segment arithmetic shared by the Collective implementations.
#include "server/collective/collective_args.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace orthoserve::collective_internal {

absl::Status CheckAllToAllvArgs(int rank, int world, absl::Span<const size_t> send_bytes,
                                absl::Span<const size_t> recv_bytes) {
  if (send_bytes.size() != static_cast<size_t>(world) || recv_bytes.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllv: send_bytes has ", send_bytes.size(),
                                                   " entries and recv_bytes ", recv_bytes.size(),
                                                   "; both must have world = ", world));
  }
  if (send_bytes[rank] != recv_bytes[rank]) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllv: rank ", rank, " sends ", send_bytes[rank],
                                                   " bytes to itself but expects ", recv_bytes[rank]));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGathervArgs(int rank, int world, size_t send_bytes, absl::Span<const size_t> recv_bytes) {
  if (recv_bytes.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherv: recv_bytes has ", recv_bytes.size(), " entries; must have world = ", world));
  }
  if (recv_bytes[rank] != send_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("AllGatherv: rank ", rank, " contributes ", send_bytes,
                                                   " bytes but recv_bytes[", rank, "] is ", recv_bytes[rank]));
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(int root, int world) {
  if (root < 0 || root >= world) {
    return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " is outside [0, ", world, ")"));
  }
  return absl::OkStatus();
}

std::vector<size_t> SegmentOffsets(absl::Span<const size_t> bytes) {
  std::vector<size_t> offsets(bytes.size() + 1, 0);
  for (size_t p = 0; p < bytes.size(); ++p) offsets[p + 1] = offsets[p] + bytes[p];
  return offsets;
}

size_t ChunkBegin(size_t n, int world, int r) {
  const size_t w = static_cast<size_t>(world);
  const size_t ur = static_cast<size_t>(r);
  return (n / w) * ur + std::min(ur, n % w);
}

absl::Status BrokenStatus(const char* name, const absl::Status& cause) {
  return absl::UnavailableError(
      absl::StrCat(name, " collective is broken by an earlier error (", cause.ToString(), "); re-form the group"));
}

}  // namespace orthoserve::collective_internal
