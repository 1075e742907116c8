// Implementation of server/fleet/wire/fleet_client.h.
#include "server/fleet/wire/fleet_client.h"

#include <chrono>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/convert/grpc_status.h"
#include "server/fleet/wire/entry_checks.h"
#include "server/fleet/wire/fleet_codec.h"

namespace orthoserve {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(20);
constexpr absl::Duration kMaxPoll = absl::Seconds(10);
// Membership and step calls: the caller retries (joins) or fails the step (reports), so they
// are short and do not wait for a connection.
constexpr absl::Duration kControlTimeout = absl::Seconds(5);

// Store calls wait for the channel to be ready (the coordinator may still be starting, or
// restarting) until their deadline, instead of failing at once on a refused connection.
void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  context.set_wait_for_ready(true);
}

// Log and membership calls fail fast when the coordinator cannot be reached.
void SetFailFastDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  context.set_wait_for_ready(false);
}

absl::Status FleetError(absl::string_view what, const grpc::Status& status) {
  absl::Status s = FromGrpcStatus(status);
  // Any transport failure talking to the coordinator reads as "the fleet is unavailable".
  if (s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kUnknown ||
      s.code() == absl::StatusCode::kInternal) {
    s = absl::UnavailableError(s.message());
  }
  return Annotate(s, absl::StrCat("fleet coordinator ", what));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeFleetChannel(const std::string& address, const FleetTls* tls,
                                                                int rank) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kFleetMessageBytes);
  args.SetMaxSendMessageSize(kFleetMessageBytes);
  if (tls == nullptr) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  RETURN_IF_ERROR(tls->ExpectServerRank(rank, args));
  return grpc::CreateCustomChannel(address, tls->ChannelCredentials(), args);
}

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel) : stub_(fleet::v1::Fleet::NewStub(channel)) {}

absl::Status GrpcStore::Set(absl::string_view key, absl::string_view value) {
  grpc::ClientContext context;
  SetDeadline(context, kRpcTimeout);
  fleet::v1::StoreSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  fleet::v1::StoreSetResponse response;
  grpc::Status status = stub_->StoreSet(&context, request, &response);
  return status.ok() ? absl::OkStatus() : FleetError("StoreSet", status);
}

absl::StatusOr<std::string> GrpcStore::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    const absl::Duration wait = std::max(absl::ZeroDuration(), std::min(left, kMaxPoll));
    grpc::ClientContext context;
    SetDeadline(context, wait + kRpcTimeout);
    fleet::v1::StoreGetRequest request;
    request.set_key(std::string(key));
    request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    fleet::v1::StoreGetResponse response;
    grpc::Status status = stub_->StoreGet(&context, request, &response);
    if (!status.ok()) {
      if (absl::Now() >= deadline) return FleetError("StoreGet", status);
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    if (response.found()) return response.value();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key \"", key, "\" did not appear within ", absl::FormatDuration(timeout)));
    }
  }
}

absl::StatusOr<int64_t> GrpcStore::Add(absl::string_view key, int64_t delta) {
  grpc::ClientContext context;
  SetDeadline(context, kRpcTimeout);
  fleet::v1::StoreAddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  fleet::v1::StoreAddResponse response;
  grpc::Status status = stub_->StoreAdd(&context, request, &response);
  if (!status.ok()) return FleetError("StoreAdd", status);
  return response.value();
}

absl::Status GrpcStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& key : keys) {
    RETURN_IF_ERROR(Get(key, std::max(absl::ZeroDuration(), deadline - absl::Now())).status());
  }
  return absl::OkStatus();
}

RemoteLogSource::RemoteLogSource(std::shared_ptr<grpc::Channel> channel)
    : stub_(fleet::v1::Fleet::NewStub(channel)) {}

RemoteLogSource::~RemoteLogSource() = default;

class RemoteLogSource::Tracked {
 public:
  Tracked(RemoteLogSource& source, grpc::ClientContext& context) : source_(source), context_(context) {
    absl::MutexLock lock(&source_.mu_);
    if (source_.cancelled_) context_.TryCancel();
    source_.calls_.insert(&context_);
  }
  ~Tracked() {
    absl::MutexLock lock(&source_.mu_);
    source_.calls_.erase(&context_);
  }
  // UNAVAILABLE when CancelAll ended the call, else the call's own error.
  absl::Status Error(absl::string_view what, const grpc::Status& status) {
    {
      absl::MutexLock lock(&source_.mu_);
      if (source_.cancelled_) {
        return absl::UnavailableError(absl::StrCat("fleet coordinator ", what, ": the coordinator moved"));
      }
    }
    return FleetError(what, status);
  }

 private:
  RemoteLogSource& source_;
  grpc::ClientContext& context_;
};

void RemoteLogSource::CancelAll() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

absl::StatusOr<LogSource::Joined> RemoteLogSource::Join(const Member& me) {
  {
    // The coordinator's protocol first, without joining: a coordinator of an older release would
    // admit this rank and then speak a log it cannot read.
    grpc::ClientContext context;
    SetFailFastDeadline(context, kControlTimeout);
    Tracked tracked(*this, context);
    fleet::v1::StoreGetRequest request;
    request.set_key(kFleetProtocolKey);
    request.set_timeout_ms(0);
    fleet::v1::StoreGetResponse response;
    grpc::Status status = stub_->StoreGet(&context, request, &response);
    if (!status.ok()) return tracked.Error("StoreGet", status);
    const std::string mine = std::to_string(kFleetProtocol);
    if (!response.found() || response.value() != mine) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the fleet coordinator speaks fleet protocol ", response.found() ? response.value() : "1 or older",
          " and this rank ", mine, ": ranks of different releases do not form a fleet, so this rank stays out of it "
          "(serving lone clients) until rank 0 runs its release"));
    }
  }
  grpc::ClientContext context;
  SetFailFastDeadline(context, kControlTimeout);
  Tracked tracked(*this, context);
  fleet::v1::JoinRequest request;
  *request.mutable_member() = MemberToProto(me);
  request.set_protocol(kFleetProtocol);
  fleet::v1::JoinResponse response;
  grpc::Status status = stub_->Join(&context, request, &response);
  if (!status.ok()) return tracked.Error("Join", status);
  return Joined{response.epoch(), response.log_from()};
}

absl::Status RemoteLogSource::Leave(int rank, uint64_t incarnation, uint64_t epoch) {
  grpc::ClientContext context;
  SetFailFastDeadline(context, kControlTimeout);
  Tracked tracked(*this, context);
  fleet::v1::LeaveRequest request;
  request.set_rank(rank);
  request.set_incarnation(incarnation);
  request.set_epoch(epoch);
  fleet::v1::LeaveResponse response;
  grpc::Status status = stub_->Leave(&context, request, &response);
  return status.ok() ? absl::OkStatus() : tracked.Error("Leave", status);
}

absl::Status RemoteLogSource::Report(const ReadyReport& report) {
  grpc::ClientContext context;
  SetFailFastDeadline(context, kControlTimeout);
  Tracked tracked(*this, context);
  fleet::v1::ReportResponse response;
  grpc::Status status = stub_->Report(&context, ReadyReportToProto(report), &response);
  return status.ok() ? absl::OkStatus() : tracked.Error("Report", status);
}

absl::Status RemoteLogSource::Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason,
                                    uint64_t submission, int fleet_rank, uint64_t incarnation) {
  grpc::ClientContext context;
  SetFailFastDeadline(context, kControlTimeout);
  Tracked tracked(*this, context);
  fleet::v1::AbortRequest request;
  *request.mutable_key() = GroupKeyToProto(key);
  request.set_trainer_rank(trainer_rank);
  request.set_code(static_cast<int>(reason.code()));
  request.set_message(std::string(reason.message()));
  request.set_submission(submission);
  request.set_fleet_rank(fleet_rank);
  request.set_incarnation(incarnation);
  fleet::v1::AbortResponse response;
  grpc::Status status = stub_->Abort(&context, request, &response);
  return status.ok() ? absl::OkStatus() : tracked.Error("Abort", status);
}

absl::StatusOr<std::vector<LogEntry>> RemoteLogSource::Read(const ReaderState& reader, int64_t from,
                                                            absl::Duration timeout) {
  grpc::ClientContext context;
  // A short margin: the executor polls continuously and must notice a dead coordinator (and its
  // own shutdown) within a few seconds.
  SetFailFastDeadline(context, std::min(timeout, kMaxPoll) + absl::Seconds(2));
  Tracked tracked(*this, context);
  fleet::v1::ReadLogRequest request;
  request.set_reader(reader.rank);
  request.set_epoch(reader.epoch);
  request.set_incarnation(reader.incarnation);
  request.set_formed_generation(reader.formed_generation);
  request.set_failed_generation(reader.failed_generation);
  // Kept notices of one step usually share a spec list: each distinct list is encoded once.
  absl::flat_hash_map<const SpecList*, std::string> lists;
  for (const ReadyReport& r : reader.kept) {
    auto [list, fresh] = lists.try_emplace(r.sent.specs.get());
    if (fresh) list->second = SpecListToBytes(*r.sent.specs);
    *request.add_kept() = ReadyReportToProto(r, &list->second);
  }
  request.set_from(from);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  fleet::v1::ReadLogResponse response;
  grpc::Status status = stub_->ReadLog(&context, request, &response);
  if (!status.ok()) return tracked.Error("ReadLog", status);
  std::vector<LogEntry> entries;
  for (const std::string& bytes : response.entries()) {
    fleet::v1::LogEntry p;
    if (!p.ParseFromString(bytes)) return absl::InternalError("ReadLog: a log entry from the coordinator does not parse");
    ASSIGN_OR_RETURN(LogEntry entry, LogEntryFromProto(p));
    if (absl::Status shape = CheckBatchShape(entry); !shape.ok()) {
      LOG_WARNING("fleet") << "log entry " << entry.index << " from the fleet coordinator: " << shape.message()
                           << "; its step fails";
      entry = UnusableBatch(entry, shape);
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace orthoserve
