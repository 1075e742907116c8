// GlooCollective: every operation as posted point-to-point transfers over Gloo unbound buffers.
#include "server/collective/gloo/gloo_collective.h"

#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"
#include "server/collective/collective_args.h"
#include "server/collective/gloo/gloo_status.h"
#include "server/collective/gloo/gloo_store_adapter.h"
#include "server/collective/prefix_store.h"

namespace orthoserve {
namespace {

using collective_internal::BrokenStatus;
using collective_internal::ChunkBegin;
using collective_internal::SegmentOffsets;
using gloo_internal::CallGloo;

// Slot prefix of our transfers; Gloo's own algorithms use 0x01..0x08.
constexpr uint8_t kSlotPrefix = 0x4f;
// Longest single wait handed to Gloo (an infinite timeout becomes this).
constexpr absl::Duration kMaxWait = absl::Hours(24 * 365);

// What is left until `deadline`, as Gloo wants it: at least 1 ms (Gloo treats non-positive
// values as "unset" or rejects them), at most kMaxWait.
std::chrono::milliseconds WaitBudget(absl::Time deadline) {
  const absl::Duration left = std::clamp(deadline - absl::Now(), absl::Milliseconds(1), kMaxWait);
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
}

// Gloo's TCP transport writes to its sockets with writev(2), without MSG_NOSIGNAL, from the
// caller's thread and from its event-loop thread. When a peer has gone, that write raises
// SIGPIPE, whose default action kills the whole process — a vanished rank must instead be an
// UNAVAILABLE status. So the first Create sets SIGPIPE to "ignore" (writes then fail with
// EPIPE, which Gloo reports) unless the program has installed its own disposition.
void IgnoreSigpipeUnlessHandled() {
  static const bool done = [] {
    struct sigaction current = {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
    return true;
  }();
  (void)done;
}

// Checks that `hostname` resolves, before Gloo sees it: Gloo's tcp::CreateDeviceAttr crashes
// the process (SIGSEGV inside it, seen with libgloo 0.0~git20220518) on a name that does not
// resolve, instead of throwing.
// INVALID_ARGUMENT for a name that does not resolve, UNAVAILABLE for a transient DNS failure.
absl::Status CheckResolvable(const std::string& hostname) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (result != nullptr) freeaddrinfo(result);
  if (rv == 0) return absl::OkStatus();
  const std::string message = absl::StrCat("GlooCollective: hostname '", hostname, "' does not resolve (",
                                           gai_strerror(rv), "); set hostname to an address of this host");
  if (rv == EAI_AGAIN) return absl::UnavailableError(message);
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(const Options& options) {
  if (options.world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GlooCollective: world must be >= 1, got ", options.world));
  }
  if (options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCollective: rank ", options.rank, " is outside [0, world = ", options.world, ")"));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("GlooCollective: store must be set");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCollective: timeout must be positive, got ", absl::FormatDuration(options.timeout)));
  }
  if (options.hostname.empty() && options.interface.empty()) {
    return absl::InvalidArgumentError("GlooCollective: set hostname or interface to bind");
  }

  if (!options.interface.empty() && if_nametoindex(options.interface.c_str()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("GlooCollective: network interface '", options.interface,
                                                   "' does not exist on this host; set interface to one that "
                                                   "does (see `ip link`) or leave it empty and set hostname"));
  }
  if (options.interface.empty()) RETURN_IF_ERROR(CheckResolvable(options.hostname));
  IgnoreSigpipeUnlessHandled();
  PrefixStore scoped(options.store, options.prefix.empty() ? "gloo" : absl::StrCat(options.prefix, "/gloo"));
  gloo_internal::GlooStoreAdapter adapter(&scoped, options.timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  RETURN_IF_ERROR(CallGloo(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ", options.world), [&] {
    gloo::transport::tcp::attr attr;
    if (!options.interface.empty()) {
      attr.iface = options.interface;
    } else {
      attr.hostname = options.hostname;
    }
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world);
    context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(std::min(options.timeout, kMaxWait))));
    context->connectFullMesh(adapter, device);
  }));
  return std::unique_ptr<GlooCollective>(new GlooCollective(options.rank, options.world, std::move(context)));
}

GlooCollective::GlooCollective(int rank, int world, std::shared_ptr<gloo::Context> context)
    : rank_(rank), world_(world), context_(std::move(context)) {}

GlooCollective::~GlooCollective() = default;

absl::Status GlooCollective::CheckUsable() const {
  if (!broken_.ok()) return BrokenStatus("gloo", broken_);
  absl::MutexLock lock(&abort_mu_);
  if (!aborted_.ok()) return aborted_;
  return absl::OkStatus();
}

void GlooCollective::Abort(absl::string_view reason) {
  absl::MutexLock lock(&abort_mu_);
  if (aborted_.ok()) aborted_ = absl::UnavailableError(absl::StrCat("gloo collective aborted: ", reason));
  // An abort requested before the wait starts makes that wait return false at once (Gloo keeps
  // the request until a wait consumes it), so there is no window in which it is lost.
  if (sending_ != nullptr) sending_->abortWaitSend();
  if (receiving_ != nullptr) receiving_->abortWaitRecv();
  // No exchange is using the connections: close them now, so that peers blocked on this rank
  // fail at once (an exchange in progress closes them itself when its aborted wait returns).
  if (!in_exchange_) CloseLocked();
}

void GlooCollective::CloseLocked() {
  // Moved out first: the lambda is analysed as a function of its own, which holds no lock.
  std::shared_ptr<gloo::Context> closing = std::move(context_);
  (void)CallGloo("gloo close", [&] { closing.reset(); });
}

absl::Status GlooCollective::Fail(absl::Status status) {
  if (broken_.ok()) broken_ = status;
  // Dropping the context closes every pair (once the buffers of the failed call, which share
  // the transport context, are gone), so the transport no longer touches our memory and the
  // peers' pending transfers fail now rather than at their own timeout.
  absl::MutexLock lock(&abort_mu_);
  CloseLocked();
  return status;
}

absl::Status GlooCollective::Exchange(const char* op, const void* send, size_t send_size,
                                      absl::Span<const Transfer> sends, void* recv, size_t recv_size,
                                      absl::Span<const Transfer> recvs, absl::Time deadline) {
  const uint64_t slot = gloo::Slot::build(kSlotPrefix, next_tag_++);
  if (sends.empty() && recvs.empty()) return absl::OkStatus();
  gloo::Context* context = nullptr;
  {
    // From here until the end of the exchange an abort leaves the context to this thread.
    absl::MutexLock lock(&abort_mu_);
    if (!aborted_.ok()) {
      CloseLocked();
      return aborted_;
    }
    if (context_ == nullptr) return absl::UnavailableError("gloo collective is closed");
    in_exchange_ = true;
    context = context_.get();
  }
  // Declared out here so that on error Fail() closes the connections before they are destroyed.
  std::unique_ptr<gloo::transport::UnboundBuffer> in;
  std::unique_ptr<gloo::transport::UnboundBuffer> out;
  absl::Status status = CallGloo(absl::StrCat("gloo ", op, " on rank ", rank_, " of ", world_), [&] {
    // Gloo's buffer type is not const-aware; `in` is only ever read from.
    if (!sends.empty()) in = context->createUnboundBuffer(const_cast<void*>(send), send_size);
    if (!recvs.empty()) out = context->createUnboundBuffer(recv, recv_size);
    {
      absl::MutexLock lock(&abort_mu_);
      if (!aborted_.ok()) throw gloo::IoException(std::string(aborted_.message()));
      sending_ = in.get();
      receiving_ = out.get();
    }
    for (const Transfer& t : recvs) out->recv(t.peer, slot, t.offset, t.bytes);
    for (const Transfer& t : sends) in->send(t.peer, slot, t.offset, t.bytes);
    for (size_t i = 0; i < sends.size(); ++i) {
      if (!in->waitSend(WaitBudget(deadline))) throw gloo::IoException("send was aborted");
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!out->waitRecv(WaitBudget(deadline))) throw gloo::IoException("receive was aborted");
    }
  });
  absl::Status aborted;
  {
    absl::MutexLock lock(&abort_mu_);
    sending_ = nullptr;
    receiving_ = nullptr;
    in_exchange_ = false;
    aborted = aborted_;
  }
  // An abort wins over the error it provoked ("send was aborted"): it says why.
  if (!status.ok() && !aborted.ok()) status = aborted;
  if (!status.ok()) return Fail(std::move(status));
  return absl::OkStatus();
}

absl::Status GlooCollective::AllToAllv(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                                       absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CheckUsable());
  absl::Status args = collective_internal::CheckAllToAllvArgs(rank_, world_, send_bytes, recv_bytes);
  if (!args.ok()) return Fail(std::move(args));
  const std::vector<size_t> send_offsets = SegmentOffsets(send_bytes);
  const std::vector<size_t> recv_offsets = SegmentOffsets(recv_bytes);
  if (send_bytes[rank_] > 0) {
    std::memcpy(static_cast<char*>(recv) + recv_offsets[rank_], static_cast<const char*>(send) + send_offsets[rank_],
                send_bytes[rank_]);
  }
  std::vector<Transfer> sends, recvs;
  for (int i = 1; i < world_; ++i) {
    const int to = (rank_ + i) % world_;
    const int from = (rank_ + world_ - i) % world_;
    if (send_bytes[to] > 0) sends.push_back({to, send_offsets[to], send_bytes[to]});
    if (recv_bytes[from] > 0) recvs.push_back({from, recv_offsets[from], recv_bytes[from]});
  }
  return Exchange("AllToAllv", send, send_offsets.back(), sends, recv, recv_offsets.back(), recvs, deadline);
}

absl::Status GlooCollective::AllGatherv(const void* send, size_t send_bytes, void* recv,
                                        absl::Span<const size_t> recv_bytes, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CheckUsable());
  absl::Status args = collective_internal::CheckAllGathervArgs(rank_, world_, send_bytes, recv_bytes);
  if (!args.ok()) return Fail(std::move(args));
  const std::vector<size_t> offsets = SegmentOffsets(recv_bytes);
  char* own = static_cast<char*>(recv) + offsets[rank_];
  if (send_bytes > 0 && own != send) std::memmove(own, send, send_bytes);
  std::vector<Transfer> sends, recvs;
  for (int i = 1; i < world_; ++i) {
    const int to = (rank_ + i) % world_;
    const int from = (rank_ + world_ - i) % world_;
    if (send_bytes > 0) sends.push_back({to, 0, send_bytes});
    if (recv_bytes[from] > 0) recvs.push_back({from, offsets[from], recv_bytes[from]});
  }
  return Exchange("AllGatherv", send, send_bytes, sends, recv, offsets.back(), recvs, deadline);
}

template <typename T>
absl::Status GlooCollective::AllReduceSumImpl(absl::Span<T> values, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CheckUsable());
  const size_t n = values.size();
  if (n == 0 || world_ == 1) return absl::OkStatus();
  auto begin = [&](int r) { return ChunkBegin(n, world_, r); };
  auto count = [&](int r) { return begin(r + 1) - begin(r); };
  const size_t mine = count(rank_);

  // Reduce-scatter: contributions[p * mine + e] is rank p's value of element begin(rank_) + e.
  std::vector<T> contributions(mine * world_);
  std::copy_n(values.data() + begin(rank_), mine, contributions.data() + rank_ * mine);
  std::vector<Transfer> sends, recvs;
  for (int i = 1; i < world_; ++i) {
    const int to = (rank_ + i) % world_;
    const int from = (rank_ + world_ - i) % world_;
    if (count(to) > 0) sends.push_back({to, begin(to) * sizeof(T), count(to) * sizeof(T)});
    if (mine > 0) recvs.push_back({from, from * mine * sizeof(T), mine * sizeof(T)});
  }
  RETURN_IF_ERROR(Exchange("AllReduceSum (reduce-scatter)", values.data(), n * sizeof(T), sends, contributions.data(),
                           contributions.size() * sizeof(T), recvs, deadline));

  // Rank-order sum of the owned slice, written into place.
  T* slice = values.data() + begin(rank_);
  for (size_t e = 0; e < mine; ++e) {
    T sum = contributions[e];
    for (int p = 1; p < world_; ++p) sum += contributions[p * mine + e];
    slice[e] = sum;
  }

  // All-gather of the summed slices: the owned slice goes to every rank, the others arrive in
  // place (disjoint from the slice being sent).
  sends.clear();
  recvs.clear();
  for (int i = 1; i < world_; ++i) {
    const int to = (rank_ + i) % world_;
    const int from = (rank_ + world_ - i) % world_;
    if (mine > 0) sends.push_back({to, begin(rank_) * sizeof(T), mine * sizeof(T)});
    if (count(from) > 0) recvs.push_back({from, begin(from) * sizeof(T), count(from) * sizeof(T)});
  }
  return Exchange("AllReduceSum (all-gather)", values.data(), n * sizeof(T), sends, values.data(), n * sizeof(T), recvs,
                  deadline);
}

absl::Status GlooCollective::AllReduceSum(absl::Span<float> values, absl::Duration timeout) {
  return AllReduceSumImpl(values, timeout);
}

absl::Status GlooCollective::AllReduceSum(absl::Span<double> values, absl::Duration timeout) {
  return AllReduceSumImpl(values, timeout);
}

absl::Status GlooCollective::Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CheckUsable());
  absl::Status args = collective_internal::CheckRoot(root, world_);
  if (!args.ok()) return Fail(std::move(args));
  if (bytes == 0) return absl::OkStatus();
  std::vector<Transfer> sends, recvs;
  if (rank_ == root) {
    for (int i = 1; i < world_; ++i) sends.push_back({(root + i) % world_, 0, bytes});
  } else {
    recvs.push_back({root, 0, bytes});
  }
  return Exchange("Broadcast", data, bytes, sends, data, bytes, recvs, deadline);
}

absl::Status GlooCollective::Barrier(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CheckUsable());
  char token = 1;
  std::vector<char> tokens(world_, 0);
  std::vector<Transfer> sends, recvs;
  for (int i = 1; i < world_; ++i) {
    const int to = (rank_ + i) % world_;
    const int from = (rank_ + world_ - i) % world_;
    sends.push_back({to, 0, 1});
    recvs.push_back({from, static_cast<size_t>(from), 1});
  }
  return Exchange("Barrier", &token, 1, sends, tokens.data(), tokens.size(), recvs, deadline);
}

}  // namespace orthoserve
