// LocalCollective: world 1, copies only.
#include "server/collective/local_collective.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/collective/collective_args.h"

namespace orthoserve {

using collective_internal::BrokenStatus;

absl::Status LocalCollective::CheckUsable() const {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return BrokenStatus("local", broken_);
  return absl::OkStatus();
}

absl::Status LocalCollective::Fail(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = status;
  return status;
}

absl::Status LocalCollective::CopySelf(void* dst, const void* src, size_t bytes) {
  if (device_copy_ == nullptr) {
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status copied = device_copy_(dst, src, bytes);
  if (!copied.ok()) return Fail(copied);
  return absl::OkStatus();
}

void LocalCollective::Abort(absl::string_view reason) {
  (void)Fail(absl::UnavailableError(absl::StrCat("local collective aborted: ", reason)));
}

absl::Status LocalCollective::AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                                        absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckUsable());
  absl::Status args = collective_internal::CheckAllToAllvArgs(0, 1, send_bytes, recv_bytes);
  if (!args.ok()) return Fail(args);
  if (send_bytes[0] > 0) return CopySelf(recv, send, send_bytes[0]);
  return absl::OkStatus();
}

absl::Status LocalCollective::AllGatherv(const void* send, size_t send_bytes, void* recv,
                                         absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckUsable());
  absl::Status args = collective_internal::CheckAllGathervArgs(0, 1, send_bytes, recv_bytes);
  if (!args.ok()) return Fail(args);
  if (send_bytes > 0 && send != recv) return CopySelf(recv, send, send_bytes);
  return absl::OkStatus();
}

absl::Status LocalCollective::AllReduceSum(absl::Span<float> values, absl::Duration timeout) { return CheckUsable(); }

absl::Status LocalCollective::AllReduceSum(absl::Span<double> values, absl::Duration timeout) { return CheckUsable(); }

absl::Status LocalCollective::Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckUsable());
  absl::Status args = collective_internal::CheckRoot(root, 1);
  if (!args.ok()) return Fail(args);
  return absl::OkStatus();
}

absl::Status LocalCollective::Barrier(absl::Duration timeout) { return CheckUsable(); }

}  // namespace orthoserve
