// Implementation of client/cpp/client.h.
#include "client/cpp/client.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/chunking.h"
#include "proto/convert/grpc_status.h"
#include "client/cpp/health.h"
#include "client/cpp/run_id.h"
#include "client/cpp/step_call.h"
#include "client/cpp/step_codec.h"
#include "client/cpp/step_protocol.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace orthoserve::client {
namespace {

// Chunk buffers kept for reuse between messages and steps (a few chunks are in flight at a time).
constexpr int64_t kMaxIdleSendBytes = int64_t{64} << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", what, " file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", what, " file ", path));
  return text.str();
}

// INVALID_ARGUMENT naming the matrix when a result buffer overlaps another result buffer or any
// input's data (inputs may share data with each other).
absl::Status CheckResultBuffersApart(absl::Span<const MatrixInput> inputs) {
  struct Range {
    uintptr_t begin, end;
    bool result;
    size_t index;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const MatrixInput& in = inputs[i];
    if (in.data != nullptr && in.bytes > 0) {
      ranges.push_back({reinterpret_cast<uintptr_t>(in.data), reinterpret_cast<uintptr_t>(in.data) + in.bytes, false, i});
    }
    if (in.result != nullptr && in.result_bytes > 0) {
      const auto p = reinterpret_cast<uintptr_t>(in.result);
      ranges.push_back({p, p + in.result_bytes, true, i});
    }
  }
  if (std::none_of(ranges.begin(), ranges.end(), [](const Range& r) { return r.result; })) return absl::OkStatus();
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // Every earlier range ending after a range's start overlaps it: one of the two must not be a result.
  const Range* furthest = nullptr;         // The earlier range that ends last.
  const Range* furthest_result = nullptr;  // The earlier result buffer that ends last.
  for (const Range& r : ranges) {
    const Range* other = r.result ? furthest : furthest_result;
    if (other != nullptr && other->end > r.begin) {
      const Range& result = r.result ? r : *other;
      const Range& with = r.result ? *other : r;
      return absl::InvalidArgumentError(absl::StrCat(
          "matrix \"", inputs[result.index].name, "\": its result buffer overlaps ",
          with.result ? "the result buffer" : "the input data", " of matrix \"", inputs[with.index].name,
          "\"; every result needs a buffer of its own, apart from the inputs (a retry sends them again)"));
    }
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
    if (r.result && (furthest_result == nullptr || r.end > furthest_result->end)) furthest_result = &r;
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT for an empty list, duplicate names or overlapping result buffers; each input's
// CheckInput otherwise.
absl::Status CheckInputs(absl::Span<const MatrixInput> inputs) {
  if (inputs.empty()) return absl::InvalidArgumentError("no matrices given; a call needs at least one");
  absl::flat_hash_set<std::string> names;
  for (const MatrixInput& input : inputs) {
    RETURN_IF_ERROR(CheckInput(input).status());
    if (!names.insert(input.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("matrix name \"", input.name, "\" is used twice; names must be unique"));
    }
  }
  return CheckResultBuffersApart(inputs);
}

// INVALID_ARGUMENT for bad inputs (CheckInputs) or a rank outside 0..world-1.
absl::Status CheckStep(const StepOptions& step, absl::Span<const MatrixInput> inputs) {
  RETURN_IF_ERROR(CheckInputs(inputs));
  if (step.world < 1 || step.rank < 0 || step.rank >= step.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("step rank ", step.rank, " of world ", step.world, " is invalid; need 0 <= rank < world"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ClientAddresses(const ClientOptions& options) {
  return options.addresses.empty() ? std::vector<std::string>{options.address} : options.addresses;
}

// The attempts of one call that fails over: attempt k goes to the k-th target after the one that
// answered last (cycling), and the one that answers becomes the client's preferred target.
//
// A call pinned to one target (its inputs name shared-memory regions there) makes every attempt
// there and leaves the preferred target alone.
class Client::Attempts {
 public:
  Attempts(Client* client, absl::string_view call, std::optional<size_t> pinned = std::nullopt)
      : client_(client),
        call_(call),
        first_(client->preferred()),
        pinned_(pinned),
        loop_(client->options_.retry, client->retry_environment_.get(), client->options_.timeout, "",
              &client->retries_) {
    loop_.set_what(What());
  }

  // The target of the current attempt.
  size_t target() const {
    return pinned_.has_value() ? *pinned_ : (first_ + loop_.attempt()) % client_->targets_.size();
  }
  int attempt() const { return loop_.attempt(); }
  absl::Duration Timeout() { return loop_.AttemptTimeout(); }
  // RetryLoop::BackOff; the log lines of the next attempt name its address.
  bool BackOff(const absl::Status& status) {
    if (!loop_.BackOff(status)) return false;
    loop_.set_what(What());
    return true;
  }
  absl::Status GiveUp(const absl::Status& status) const {
    absl::Status given_up = loop_.GiveUp(status);
    if (pinned_.has_value() && client_->targets_.size() > 1 && (IsRetryable(status) || loop_.TimedOut(status))) {
      return AnnotateKeepingMarks(
          given_up, absl::StrCat("the call names shared-memory regions of ", client_->targets_[*pinned_].address,
                                 ", so it was not failed over to another address"));
    }
    return given_up;
  }
  // The current target answered: calls start there from now on (unless the call was pinned).
  void Answered() {
    if (!pinned_.has_value()) client_->preferred_.store(target(), std::memory_order_relaxed);
  }

 private:
  std::string What() const { return absl::StrCat(call_, " to ", client_->targets_[target()].address); }

  Client* const client_;
  const std::string call_;
  const size_t first_;
  const std::optional<size_t> pinned_;
  RetryLoop loop_;
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  const std::vector<std::string> addresses = ClientAddresses(options);
  for (const std::string& address : addresses) {
    if (address.empty()) return absl::InvalidArgumentError("a client address is empty; give HOST:PORT");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("client timeout must be positive (or infinite)");
  }
  if (options.keepalive_time <= absl::ZeroDuration() || options.keepalive_timeout <= absl::ZeroDuration() ||
      options.keepalive_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "client keepalive_time must be positive (or infinite: no keepalive), keepalive_timeout positive and finite");
  }
  RETURN_IF_ERROR(ValidateRetryOptions(options.retry));
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("mutual TLS needs both a client certificate and its key");
  }
  const bool tls = !options.tls_ca_file.empty() || !options.tls_cert_file.empty();
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.tls_ca_file, "TLS CA"));
    }
    if (!options.tls_cert_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFile(options.tls_cert_file, "TLS certificate"));
      ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFile(options.tls_key_file, "TLS key"));
    }
    credentials = grpc::SslCredentials(ssl);
  } else if (!options.tls_server_name.empty()) {
    return absl::InvalidArgumentError("a TLS server name was given without TLS; also give a CA file");
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  // A server that was down for a while is dialled again within the retry policy's largest wait
  // once it is back (as the Python client does): gRPC's own backoff grows to two minutes, and a
  // channel in backoff fails every call at once with the last connection error, so the rank
  // would look dead long after it returned. (Raised below to the minimum backoff if that is larger.)
  int max_backoff_ms = static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(options.retry.max_backoff), 100,
                                                            std::numeric_limits<int>::max()));
  if (options.keepalive_time != absl::InfiniteDuration()) {
    const int keepalive_time_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(options.keepalive_time), 1, std::numeric_limits<int>::max()));
    const int keepalive_timeout_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(options.keepalive_timeout), 1, std::numeric_limits<int>::max()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_time_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_timeout_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    // A step may send nothing for minutes (a rendezvous, a large batch): keep pinging through it;
    // gRPC otherwise stops after two pings without data, and a dead peer goes unnoticed.
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    // Newer gRPC cores end an unanswered keepalive ping only after this (default a minute); 1.51
    // does not know it and ignores it.
    args.SetInt("grpc.http2.ping_timeout_ms", keepalive_timeout_ms);
    // Keepalive guards an established connection only: a connection attempt to a server that
    // accepts TCP but does not answer (a stopped process) would otherwise hold the calls waiting
    // for it for gRPC's 20 s minimum connect timeout. Give it up as keepalive would.
    const int min_backoff_ms = static_cast<int>(
        std::min<int64_t>(int64_t{keepalive_time_ms} + keepalive_timeout_ms, std::numeric_limits<int>::max()));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, min_backoff_ms);
    max_backoff_ms = std::max(max_backoff_ms, min_backoff_ms);
  }
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  // The first redial after a lost connection comes as soon as the retry policy's first wait (gRPC's
  // default is a second): a rank restarted in a rolling update is back within a few hundred
  // milliseconds, and calls meanwhile fail at once with the refused connection (as in the Python client).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(options.retry.initial_backoff), 100,
                                                   max_backoff_ms)));
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  std::vector<Target> targets;
  for (const std::string& address : addresses) {
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, credentials, args);
    if (channel == nullptr) return absl::InternalError(absl::StrCat("cannot create a channel to ", address));
    targets.push_back(Target{address, channel, v1::Orthogonalizer::NewStub(channel)});
  }
  return std::unique_ptr<Client>(new Client(std::move(targets), options));
}

std::unique_ptr<Client> Client::CreateWithChannel(std::shared_ptr<grpc::Channel> channel,
                                                  const ClientOptions& options) {
  std::vector<Target> targets;
  targets.push_back(Target{ClientAddresses(options).front(), channel, v1::Orthogonalizer::NewStub(channel)});
  return std::unique_ptr<Client>(new Client(std::move(targets), options));
}

Client::Client(std::vector<Target> targets, const ClientOptions& options)
    : options_(options),
      retry_environment_(options.retry.environment != nullptr ? options.retry.environment
                                                              : MakeSystemRetryEnvironment()),
      targets_(std::move(targets)),
      send_buffers_(BufferPool::Create(BufferPool::Options{kMaxIdleSendBytes})),
      limits_(targets_.size()) {}

const std::string& Client::address() const { return targets_[preferred()].address; }

std::vector<std::string> Client::addresses() const {
  std::vector<std::string> out;
  for (const Target& t : targets_) out.push_back(t.address);
  return out;
}

void Client::PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const {
  if (timeout != absl::InfiniteDuration()) context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.bearer_token.empty()) context->AddMetadata("authorization", "Bearer " + options_.bearer_token);
}

void Client::Redial(size_t target) const {
  grpc::Channel* channel = targets_[target].channel.get();
  if (channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    grpc::experimental::ChannelResetConnectionBackoff(channel);
  }
}

absl::StatusOr<v1::ServerInfo> Client::InfoAttempt(size_t target, absl::Duration timeout) {
  Redial(target);
  grpc::ClientContext context;
  PrepareContext(&context, timeout);
  v1::ServerInfo info;
  const grpc::Status status = targets_[target].stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  RETURN_IF_ERROR(FromCallStatus(status, context.GetServerTrailingMetadata()));
  absl::MutexLock lock(&mu_);
  limits_[target] = info.limits();
  return info;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfoOnce(absl::Duration timeout) {
  return InfoAttempt(preferred(), timeout);
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  Attempts attempts(this, "GetServerInfo");
  while (true) {
    absl::StatusOr<v1::ServerInfo> info = InfoAttempt(attempts.target(), attempts.Timeout());
    if (info.ok()) {
      attempts.Answered();
      return info;
    }
    if (!attempts.BackOff(info.status())) return attempts.GiveUp(info.status());
  }
}

absl::Status Client::Health() {
  grpc::ClientContext context;
  PrepareContext(&context, options_.timeout);
  const Target& target = targets_[preferred()];
  ASSIGN_OR_RETURN(ServingStatus serving, CheckHealth(target.channel, &context, ""));
  if (serving == ServingStatus::kServing) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("server ", target.address, " is ", ServingStatusName(serving)));
}

absl::Status Client::EnsureLimits(size_t target, absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (limits_[target].has_value() || !options_.discover_limits) return absl::OkStatus();
  }
  absl::StatusOr<v1::ServerInfo> info = InfoAttempt(target, timeout);
  if (info.ok()) return absl::OkStatus();
  if (info.status().code() == absl::StatusCode::kUnimplemented) {  // Keep the configured chunk size.
    absl::MutexLock lock(&mu_);
    limits_[target] = v1::Limits();
    return absl::OkStatus();
  }
  return AnnotateKeepingMarks(info.status(), "asking the server for its limits (GetServerInfo)");
}

size_t Client::ChunkBytesFor(size_t target) const {
  absl::MutexLock lock(&mu_);
  return EffectiveChunkBytes(options_.chunk_bytes, limits_[target].value_or(v1::Limits()));
}

size_t Client::chunk_bytes() const { return ChunkBytesFor(preferred()); }

std::optional<v1::StepSummary> Client::last_summary() const {
  absl::MutexLock lock(&mu_);
  return last_summary_;
}

absl::StatusOr<std::vector<MatrixOutput>> Client::Orthogonalize(absl::Span<const MatrixInput> inputs) {
  RETURN_IF_ERROR(CheckInputs(inputs));
  ASSIGN_OR_RETURN(std::optional<size_t> pinned, RegionTarget(inputs));
  v1::OrthogonalizeRequest request;
  for (const MatrixInput& input : inputs) {
    v1::Matrix* m = request.add_matrices();
    *m->mutable_spec() = ToSpec(input);
    if (!input.input_region.has_value()) m->set_data(input.data, input.bytes);
  }
  Attempts attempts(this, "Orthogonalize", pinned);
  while (true) {
    // A fresh call id per attempt that names slices: a failed one is fenced under its own id.
    if (pinned.has_value()) request.set_call_id(NewCallId());
    absl::StatusOr<std::vector<MatrixOutput>> outputs =
        OrthogonalizeAttempt(attempts.target(), request, inputs, attempts.Timeout());
    if (!outputs.ok() && pinned.has_value()) outputs = Fenced(attempts.target(), request.call_id(), outputs.status());
    if (outputs.ok()) {
      attempts.Answered();
      return outputs;
    }
    if (!attempts.BackOff(outputs.status())) return attempts.GiveUp(outputs.status());
  }
}

absl::StatusOr<std::vector<MatrixOutput>> Client::OrthogonalizeAttempt(size_t target,
                                                                       const v1::OrthogonalizeRequest& request,
                                                                       absl::Span<const MatrixInput> inputs,
                                                                       absl::Duration timeout) {
  Redial(target);
  grpc::ClientContext context;
  PrepareContext(&context, timeout);
  v1::OrthogonalizeResponse response;
  const grpc::Status status = targets_[target].stub->Orthogonalize(&context, request, &response);
  RETURN_IF_ERROR(FromCallStatus(status, context.GetServerTrailingMetadata()));
  if (response.results_size() != static_cast<int>(inputs.size())) {
    return absl::InternalError(
        absl::StrCat("server protocol error: ", response.results_size(), " results for ", inputs.size(), " matrices"));
  }
  std::vector<MatrixOutput> outputs;
  outputs.reserve(inputs.size());
  for (int i = 0; i < response.results_size(); ++i) {
    v1::MatrixResult* r = response.mutable_results(i);
    if (r->index() != i || r->name() != inputs[i].name) {
      return absl::InternalError(
          absl::StrCat("server protocol error: result ", i, " is for matrix ", r->index(), " \"", r->name(), "\""));
    }
    if (r->code() == 0) RETURN_IF_ERROR(CheckResultRegion(inputs[i], *r));
    std::string data = std::move(*r->mutable_data());
    r->clear_data();
    ASSIGN_OR_RETURN(MatrixOutput out, FromResult(*r));
    RETURN_IF_ERROR(CheckLayoutEchoed(inputs[i], out));
    RETURN_IF_ERROR(CheckResultIsFor(inputs[i], i, out));
    if (out.status.ok() && inputs[i].result_region.has_value()) {  // The server wrote it into the region.
      out.in_place = true;
      out.result_region = inputs[i].result_region;
      outputs.push_back(std::move(out));
      continue;
    }
    if (data.size() != ExpectedBytes(out)) {
      return absl::InternalError(absl::StrCat("server protocol error: result ", i, " \"", r->name(), "\" has ",
                                              data.size(), " bytes, its block needs ", ExpectedBytes(out)));
    }
    RETURN_IF_ERROR(StoreResult(inputs[i], data, out));
    outputs.push_back(std::move(out));
  }
  return outputs;
}

absl::StatusOr<std::vector<MatrixOutput>> Client::Step(const StepOptions& step, absl::Span<const MatrixInput> inputs,
                                                       const ResultCallback& on_result) {
  RETURN_IF_ERROR(CheckStep(step, inputs));
  ASSIGN_OR_RETURN(std::optional<size_t> pinned, RegionTarget(inputs));
  std::vector<bool> delivered(inputs.size(), false);
  Attempts attempts(this, "Step", pinned);
  while (true) {
    absl::StatusOr<std::vector<MatrixOutput>> outputs = StepAttempt(
        attempts.target(), step, attempts.attempt(), attempts.Timeout(), inputs, on_result, &delivered);
    if (outputs.ok()) {
      attempts.Answered();
      return outputs;
    }
    if (!attempts.BackOff(outputs.status())) return attempts.GiveUp(outputs.status());
  }
}

absl::StatusOr<std::vector<MatrixOutput>> Client::StepOnce(const StepOptions& step, int attempt, absl::Duration timeout,
                                                           absl::Span<const MatrixInput> inputs,
                                                           const ResultCallback& on_result,
                                                           std::vector<bool>* delivered) {
  RETURN_IF_ERROR(CheckStep(step, inputs));
  if (delivered != nullptr && delivered->size() != inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepOnce: `delivered` has ", delivered->size(), " entries for ", inputs.size(), " inputs"));
  }
  ASSIGN_OR_RETURN(std::optional<size_t> pinned, RegionTarget(inputs));
  return StepAttempt(pinned.value_or(preferred()), step, attempt, timeout, inputs, on_result, delivered);
}

std::optional<size_t> Client::TargetOf(const std::string& address) const {
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (targets_[i].address == address) return i;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<size_t>> Client::RegionTarget(absl::Span<const MatrixInput> inputs) const {
  const RegionSlice* first = nullptr;
  const MatrixInput* first_input = nullptr;
  for (const MatrixInput& input : inputs) {
    for (const std::optional<RegionSlice>* slice : {&input.input_region, &input.result_region}) {
      if (!slice->has_value()) continue;
      if (first == nullptr) {
        first = &**slice;
        first_input = &input;
      } else if ((*slice)->address != first->address) {
        return absl::InvalidArgumentError(absl::StrCat(
            "matrix \"", input.name, "\" names a shared-memory region on ", (*slice)->address, ", but matrix \"",
            first_input->name, "\" one on ", first->address,
            "; one call goes to one server rank, so all the regions it names must be on one address"));
      }
    }
  }
  if (first == nullptr) return std::optional<size_t>();
  std::optional<size_t> target = TargetOf(first->address);
  if (!target.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("matrix \"", first_input->name,
                                                   "\" names a shared-memory region on ", first->address,
                                                   ", which is not one of this client's addresses"));
  }
  return target;
}

absl::StatusOr<std::unique_ptr<Region>> Client::CreateRegion(int64_t size, const RegionOptions& options) {
  if (size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a shared-memory region needs at least one byte, not ", size));
  }
  std::optional<size_t> target = options.address.empty() ? preferred() : TargetOf(options.address);
  if (!target.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("region address ", options.address, " is not one of this client's addresses"));
  }
  std::string socket_path = options.socket_path;
  if (socket_path.empty()) {
    absl::StatusOr<v1::ServerInfo> info = InfoAttempt(*target, options_.timeout);
    if (!info.ok()) {
      return AnnotateKeepingMarks(info.status(), absl::StrCat("asking ", targets_[*target].address,
                                                              " for its shared-memory socket (GetServerInfo)"));
    }
    if (info->shm_socket().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the server at ", targets_[*target].address,
                       " does not take shared-memory regions (its ServerInfo names no shm_socket: start it with "
                       "--shm-socket)"));
    }
    socket_path = info->shm_socket();
  }
  Region::Connection connection;
  connection.address = targets_[*target].address;
  connection.channel = targets_[*target].channel;
  connection.bearer_token = options_.bearer_token;
  connection.timeout = options_.timeout;
  return Region::Create(size, options.name, socket_path, std::move(connection), options.handover_timeout);
}

absl::StatusOr<std::vector<MatrixOutput>> Client::StepAttempt(size_t target, const StepOptions& step, int attempt,
                                                              absl::Duration timeout,
                                                              absl::Span<const MatrixInput> inputs,
                                                              const ResultCallback& on_result,
                                                              std::vector<bool>* delivered) {
  const bool names_regions = std::any_of(inputs.begin(), inputs.end(), [](const MatrixInput& input) {
    return input.input_region.has_value() || input.result_region.has_value();
  });
  if (!names_regions) return StreamAttempt(target, step, attempt, timeout, inputs, on_result, delivered, "");
  const std::string call_id = NewCallId();
  absl::StatusOr<std::vector<MatrixOutput>> outputs =
      StreamAttempt(target, step, attempt, timeout, inputs, on_result, delivered, call_id);
  if (outputs.ok()) return outputs;
  return Fenced(target, call_id, outputs.status());
}

absl::Status Client::Fenced(size_t target, const std::string& call_id, const absl::Status& failed) {
  const absl::Time deadline = absl::Now() + options_.fence_timeout;
  absl::Status fence;
  int tries = 0;
  for (absl::Duration pause = absl::Milliseconds(50);; pause = std::min(2 * pause, absl::Seconds(2))) {
    ++tries;
    Redial(target);
    grpc::ClientContext context;
    PrepareContext(&context, std::max(std::min(options_.timeout, deadline - absl::Now()), absl::Milliseconds(1)));
    v1::FenceCallRequest request;
    request.set_call_id(call_id);
    v1::FenceCallResponse response;
    const grpc::Status status =
        v1::SharedMemory::NewStub(targets_[target].channel)->FenceCall(&context, request, &response);
    fence = FromCallStatus(status, context.GetServerTrailingMetadata());
    if (fence.ok()) return failed;  // The server holds none of its slices: the failure is all there is.
    const bool again =
        fence.code() == absl::StatusCode::kUnavailable || fence.code() == absl::StatusCode::kDeadlineExceeded;
    if (!again || absl::Now() + pause >= deadline) break;
    LOG_WARNING("client") << "fencing a failed call that named shared-memory slices on " << targets_[target].address
                          << ": " << fence << "; trying again";
    absl::SleepFor(pause);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      failed.message(), " [", absl::StatusCodeToString(failed.code()),
      "]; and its shared-memory slices may still be written by the server at ", targets_[target].address,
      ": fencing the call (FenceCall) failed after ", tries, " tries: ", fence.ToString(),
      ". Do not reuse the slices this call named (use another region, or wait and fence again)"));
}

absl::StatusOr<std::vector<MatrixOutput>> Client::StreamAttempt(size_t target, const StepOptions& step, int attempt,
                                                                absl::Duration timeout,
                                                                absl::Span<const MatrixInput> inputs,
                                                                const ResultCallback& on_result,
                                                                std::vector<bool>* delivered,
                                                                const std::string& call_id) {
  Redial(target);
  RETURN_IF_ERROR(EnsureLimits(target, timeout));
  const size_t chunk = ChunkBytesFor(target);

  grpc::ClientContext context;
  PrepareContext(&context, timeout);
  // The stream's messages are written and read as raw bytes (step_codec.h), so that matrix data is
  // not copied into and out of protobuf messages; gRPC's callback threads write them (StepCall)
  // while this thread reassembles the results and runs on_result.
  StepCall call(&context, std::make_unique<StepRequests>(step, attempt, inputs, chunk, call_id), send_buffers_.get());
  call.Start(targets_[target].channel);

  StepResultAssembler assembler(inputs);
  absl::Status protocol_error;
  while (std::unique_ptr<StreamResponseView> response = call.Next()) {
    const absl::Status parsed = ParseStreamResponse(response.get());
    absl::StatusOr<std::optional<int>> done =
        !parsed.ok() ? absl::StatusOr<std::optional<int>>(parsed)
        : response->message.has_chunk() ? assembler.AddChunk(response->message.chunk().index(), response->chunk_data)
                                        : assembler.Add(response->message);
    if (!done.ok()) {
      protocol_error = done.status();
      context.TryCancel();
      break;
    }
    if (!done->has_value()) continue;
    const int index = **done;
    absl::Status echoed = CheckLayoutEchoed(inputs[index], assembler.output(index));
    if (echoed.ok()) echoed = CheckResultIsFor(inputs[index], index, assembler.output(index));
    if (!echoed.ok()) {
      protocol_error = echoed;
      context.TryCancel();
      break;
    }
    if (delivered != nullptr) {
      if ((*delivered)[index]) continue;  // Seen by on_result in an earlier attempt.
      (*delivered)[index] = true;
    }
    if (on_result) on_result(assembler.output(index));
  }
  const grpc::Status status = call.Finish();
  const absl::Status send_error = call.send_error();
  RETURN_IF_ERROR(send_error);
  RETURN_IF_ERROR(protocol_error);
  RETURN_IF_ERROR(FromCallStatus(status, context.GetServerTrailingMetadata()));
  RETURN_IF_ERROR(assembler.CheckComplete());
  {
    absl::MutexLock lock(&mu_);
    last_summary_ = assembler.summary();
  }
  return assembler.TakeOutputs();
}

}  // namespace orthoserve::client
