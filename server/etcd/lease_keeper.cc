// Implementation of server/etcd/lease_keeper.h.
#include "server/etcd/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "server/etcd/bidi_call.h"

namespace orthoserve::etcd {

using KeepAliveCall = BidiCall<etcdserverpb::LeaseKeepAliveRequest, etcdserverpb::LeaseKeepAliveResponse>;

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(EndpointPool* pool, Options options) {
  if (options.lease_id == 0) return absl::InvalidArgumentError("LeaseKeeper: lease_id is 0");
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("LeaseKeeper: ttl must be at least 1s (the lease's granted TTL)");
  }
  if (options.interval == absl::ZeroDuration()) options.interval = options.ttl / 3;
  if (options.interval <= absl::ZeroDuration() || options.interval >= options.ttl) {
    return absl::InvalidArgumentError("LeaseKeeper: interval must be positive and under the ttl");
  }
  std::unique_ptr<LeaseKeeper> keeper(new LeaseKeeper(pool, std::move(options)));
  keeper->thread_ = std::thread([k = keeper.get()] { k->Run(); });
  return keeper;
}

LeaseKeeper::LeaseKeeper(EndpointPool* pool, Options options) : pool_(pool), options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  last_renewed_ = absl::Now();
  last_ttl_ = options_.ttl;
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

void LeaseKeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (cancel_stream_) cancel_stream_();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status LeaseKeeper::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Time LeaseKeeper::last_renewed() const {
  absl::MutexLock lock(&mu_);
  return last_renewed_;
}

bool LeaseKeeper::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void LeaseKeeper::SleepUntil(absl::Time until) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  mu_.AwaitWithDeadline(absl::Condition(&stopping), until);
}

void LeaseKeeper::Renewed(absl::Time sent, int64_t ttl_seconds) {
  absl::MutexLock lock(&mu_);
  last_renewed_ = sent;
  last_ttl_ = absl::Seconds(ttl_seconds);
}

absl::Time LeaseKeeper::ExpiresAt() const {
  absl::MutexLock lock(&mu_);
  return last_renewed_ + last_ttl_;
}

void LeaseKeeper::Run() {
  absl::Status lost;
  while (!Stopping()) {
    if (absl::Now() >= ExpiresAt()) {
      lost = absl::UnavailableError(
          absl::StrCat("etcd lease ", options_.lease_id, ": no keep-alive acknowledged for a whole TTL"));
      break;
    }
    const absl::Status stream = RunStream();
    if (stream.code() == absl::StatusCode::kCancelled) break;
    if (!stream.ok()) {
      lost = stream;
      break;
    }
    // The stream broke or no endpoint answered: retry soon, within the lease's life.
    SleepUntil(std::min(absl::Now() + absl::Milliseconds(200), ExpiresAt()));
  }
  std::function<void(const absl::Status&)> notify;
  {
    absl::MutexLock lock(&mu_);
    status_ = lost.ok() ? absl::CancelledError("LeaseKeeper stopped") : lost;
    if (!lost.ok()) notify = options_.on_lost;
  }
  if (notify) notify(lost);
}

absl::Status LeaseKeeper::RunStream() {
  const absl::Time dial_deadline = std::min(ExpiresAt(), absl::Now() + pool_->options().dial_timeout);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = pool_->ConnectedChannel(dial_deadline);
  if (!channel.ok()) return absl::OkStatus();  // Retried by Run until the lease's TTL runs out.
  auto stub = etcdserverpb::Lease::NewStub(*channel);
  KeepAliveCall call([&stub](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
    return stub->PrepareAsyncLeaseKeepAlive(context, cq);
  });
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    cancel_stream_ = [&call] { call.Cancel(); };
  }
  absl::Status result = absl::OkStatus();
  if (call.Start(dial_deadline).ok()) {
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(options_.lease_id);
    while (!Stopping()) {
      const absl::Time sent = absl::Now();
      // Wait for the answer until the lease would expire: a late answer is still an answer.
      if (!call.Write(request, ExpiresAt()).ok()) break;
      etcdserverpb::LeaseKeepAliveResponse response;
      if (!call.Read(&response, ExpiresAt()).ok()) break;
      if (response.ttl() <= 0) {
        result = absl::NotFoundError(
            absl::StrCat("etcd lease ", options_.lease_id, ": expired or revoked (keep-alive TTL 0)"));
        break;
      }
      Renewed(sent, response.ttl());
      SleepUntil(sent + options_.interval);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    cancel_stream_ = nullptr;
    if (stopping_ && result.ok()) result = absl::CancelledError("stopping");
  }
  return result;
}

}  // namespace orthoserve::etcd
