// Implementation of server/etcd/watcher.h.
#include "server/etcd/watcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "server/etcd/bidi_call.h"
#include "server/etcd/etcd_client.h"
#include "server/etcd/kv_convert.h"

namespace orthoserve::etcd {
namespace {

// How long one wait for the next event lasts before the thread looks at Stop again (Stop
// also cancels the stream, so this only bounds the wait).
constexpr absl::Duration kPollInterval = absl::Seconds(1);

}  // namespace

// One Watch stream: the stub must outlive the call.
struct Watcher::Stream {
  using Call = BidiCall<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>;
  std::unique_ptr<etcdserverpb::Watch::Stub> stub;
  std::unique_ptr<Call> call;
};

absl::StatusOr<std::unique_ptr<Watcher>> Watcher::Start(EndpointPool* pool, Options options) {
  if (!options.on_events) return absl::InvalidArgumentError("Watcher: on_events is required");
  if (options.start_revision < 0) return absl::InvalidArgumentError("Watcher: start_revision < 0");
  std::unique_ptr<Watcher> watcher(new Watcher(pool, std::move(options)));
  const absl::Time deadline = absl::Now() + pool->options().dial_timeout + pool->options().call_timeout;
  absl::StatusOr<std::unique_ptr<Stream>> stream = watcher->OpenStream(deadline);
  if (!stream.ok()) return stream.status();
  watcher->thread_ = std::thread([w = watcher.get(), s = std::move(*stream)]() mutable { w->Run(std::move(s)); });
  return watcher;
}

Watcher::Watcher(EndpointPool* pool, Options options) : pool_(pool), options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  next_revision_ = options_.start_revision;
}

Watcher::~Watcher() { Stop(); }

void Watcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (stream_ != nullptr) stream_->call->Cancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Watcher::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

int64_t Watcher::next_revision() const {
  absl::MutexLock lock(&mu_);
  return next_revision_;
}

int Watcher::restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

void Watcher::BreakStreamForTesting() {
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr) stream_->call->Cancel();
}

bool Watcher::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Watcher::SleepUntil(absl::Time until) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  mu_.AwaitWithDeadline(absl::Condition(&stopping), until);
}

absl::StatusOr<std::unique_ptr<Watcher::Stream>> Watcher::OpenStream(absl::Time deadline) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = pool_->ConnectedChannel(deadline);
  if (!channel.ok()) return channel.status();
  auto stream = std::make_unique<Stream>();
  stream->stub = etcdserverpb::Watch::NewStub(*channel);
  etcdserverpb::Watch::Stub* stub = stream->stub.get();
  stream->call = std::make_unique<Stream::Call>(
      [stub](grpc::ClientContext* context, grpc::CompletionQueue* cq) { return stub->PrepareAsyncWatch(context, cq); });
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("Watcher stopped");
    stream_ = stream.get();  // Stop cancels it while it opens.
  }
  absl::StatusOr<std::unique_ptr<Stream>> result = Confirm(std::move(stream), deadline);
  absl::MutexLock lock(&mu_);
  stream_ = nullptr;
  return result;
}

absl::StatusOr<std::unique_ptr<Watcher::Stream>> Watcher::Confirm(std::unique_ptr<Stream> stream, absl::Time deadline) {
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(options_.prefix.empty() ? std::string(1, '\0') : options_.prefix);
  create->set_range_end(PrefixRangeEnd(options_.prefix));
  const int64_t from = next_revision();
  create->set_start_revision(from);
  // etcd then reports, now and then, how far an idle watch has got, so that next_revision_
  // moves with the store and a reconnection after a long quiet spell is not compacted away.
  create->set_progress_notify(true);
  const std::string what = absl::StrCat("etcd watch ", options_.prefix, " from revision ", from);
  if (absl::Status s = stream->call->Start(deadline); !s.ok()) return Annotate(s, what);
  if (absl::Status s = stream->call->Write(request, deadline); !s.ok()) return Annotate(s, what);
  etcdserverpb::WatchResponse response;
  if (absl::Status s = stream->call->Read(&response, deadline); !s.ok()) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::UnavailableError(absl::StrCat(what, ": not confirmed in time"));
    }
    const absl::Status finished = stream->call->Finish(deadline);
    if (finished.ok()) return absl::UnavailableError(absl::StrCat(what, ": stream ended at once"));
    return Annotate(finished, what);
  }
  if (response.compact_revision() > 0) {
    return absl::OutOfRangeError(absl::StrCat(what, ": compacted up to revision ", response.compact_revision()));
  }
  if (!response.created() || response.canceled()) {
    return absl::UnavailableError(absl::StrCat(what, ": not created (", response.cancel_reason(), ")"));
  }
  if (from == 0) {
    absl::MutexLock lock(&mu_);
    next_revision_ = response.header().revision() + 1;
  }
  return stream;
}

void Watcher::Run(std::unique_ptr<Stream> stream) {
  absl::Status ended;
  while (!Stopping()) {
    if (stream == nullptr) {
      SleepUntil(absl::Now() + options_.retry_interval);
      if (Stopping()) break;
      const absl::Time deadline = absl::Now() + pool_->options().dial_timeout + pool_->options().call_timeout;
      absl::StatusOr<std::unique_ptr<Stream>> opened = OpenStream(deadline);
      if (opened.status().code() == absl::StatusCode::kOutOfRange) {
        ended = opened.status();
        break;
      }
      if (!opened.ok()) continue;  // Tried again after retry_interval.
      stream = std::move(*opened);
      absl::MutexLock lock(&mu_);
      ++restarts_;
    }
    const absl::Status followed = Follow(*stream);
    stream.reset();
    if (followed.code() == absl::StatusCode::kOutOfRange) {
      ended = followed;
      break;
    }
  }
  std::function<void(const absl::Status&)> notify;
  {
    absl::MutexLock lock(&mu_);
    status_ = ended.ok() ? absl::CancelledError("Watcher stopped") : ended;
    if (!ended.ok()) notify = options_.on_ended;
  }
  if (notify) notify(ended);
}

absl::Status Watcher::Follow(Stream& stream) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    stream_ = &stream;
  }
  absl::Status result = absl::OkStatus();
  std::vector<WatchEvent> events;
  while (!Stopping()) {
    etcdserverpb::WatchResponse response;
    const absl::Status read = stream.call->Read(&response, absl::Now() + kPollInterval);
    if (read.code() == absl::StatusCode::kDeadlineExceeded) continue;
    if (!read.ok()) break;  // Broken: reopened by Run from next_revision_.
    if (response.compact_revision() > 0) {
      result = absl::OutOfRangeError(
          absl::StrCat("etcd watch ", options_.prefix, ": compacted up to revision ", response.compact_revision()));
      break;
    }
    if (response.canceled()) break;  // etcd dropped the watch: reopen it.
    if (response.events_size() == 0) {
      // A progress notification: every change up to the header's revision has been sent.
      if (!response.created()) {
        absl::MutexLock lock(&mu_);
        next_revision_ = std::max(next_revision_, response.header().revision() + 1);
      }
      continue;
    }
    events.clear();
    events.reserve(response.events_size());
    for (const mvccpb::Event& event : response.events()) events.push_back(FromProto(event));
    {
      absl::MutexLock lock(&mu_);
      next_revision_ = events.back().mod_revision + 1;
    }
    options_.on_events(events);
  }
  absl::MutexLock lock(&mu_);
  stream_ = nullptr;
  return result;
}

}  // namespace orthoserve::etcd
