// Implementation of server/fleet/wire/fleet_service.h.
#include "server/fleet/wire/fleet_service.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/convert/grpc_status.h"
#include "server/fleet/wire/fleet_codec.h"

namespace orthoserve {
namespace {

// Long polls are cut at this length so a peer notices a dead coordinator quickly.
constexpr int64_t kMaxWaitMs = 10000;
// Store waits check for cancellation this often.
constexpr absl::Duration kSlice = absl::Milliseconds(100);

absl::Duration WaitOf(int64_t timeout_ms) {
  return absl::Milliseconds(std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs));
}

}  // namespace

absl::Status FleetService::RequireRank(const grpc::ServerContext* context, absl::string_view call, int rank) const {
  return access_ == nullptr ? absl::OkStatus() : access_->RequireRank(*context, call, rank);
}

absl::Status FleetService::RequireMember(const grpc::ServerContext* context, absl::string_view call) const {
  return access_ == nullptr ? absl::OkStatus() : access_->RequireMember(*context, call);
}

grpc::Status FleetService::Join(grpc::ServerContext* context, const fleet::v1::JoinRequest* request,
                                fleet::v1::JoinResponse* response) {
  if (absl::Status allowed = RequireRank(context, "Join", request->member().rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  if (request->protocol() != kFleetProtocol) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "rank ", request->member().rank(), " speaks fleet protocol ", request->protocol(),
        " and this coordinator ", kFleetProtocol, ": ranks of different releases do not form a fleet")));
  }
  absl::StatusOr<int64_t> from = coordinator_->Join(MemberFromProto(request->member()));
  if (!from.ok()) return ToGrpcStatus(from.status());
  response->set_epoch(coordinator_->epoch());
  response->set_log_from(*from);
  response->set_protocol(kFleetProtocol);
  return grpc::Status::OK;
}

grpc::Status FleetService::Leave(grpc::ServerContext* context, const fleet::v1::LeaveRequest* request,
                                 fleet::v1::LeaveResponse*) {
  if (absl::Status allowed = RequireRank(context, "Leave", request->rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  return ToGrpcStatus(coordinator_->Leave(request->rank(), request->incarnation(), request->epoch()));
}

grpc::Status FleetService::StoreSet(grpc::ServerContext* context, const fleet::v1::StoreSetRequest* request,
                                    fleet::v1::StoreSetResponse*) {
  if (absl::Status allowed = RequireMember(context, "StoreSet"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  return ToGrpcStatus(store_->Set(request->key(), request->value()));
}

grpc::Status FleetService::StoreGet(grpc::ServerContext* context, const fleet::v1::StoreGetRequest* request,
                                    fleet::v1::StoreGetResponse* response) {
  if (absl::Status allowed = RequireMember(context, "StoreGet"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  // The coordinator's protocol, for ranks to read before they join (fleet.proto, "Versions").
  if (request->key() == kFleetProtocolKey) {
    response->set_found(true);
    response->set_value(std::to_string(kFleetProtocol));
    return grpc::Status::OK;
  }
  // Waits in short slices, so that a call the server cancels (its shutdown deadline passed)
  // ends at once rather than holding the shutdown for the whole wait.
  const absl::Time deadline = absl::Now() + WaitOf(request->timeout_ms());
  absl::StatusOr<std::string> value;
  for (;;) {
    value = store_->Get(request->key(), std::min(kSlice, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    if (value.status().code() != absl::StatusCode::kDeadlineExceeded) break;
    if (absl::Now() >= deadline || context->IsCancelled()) break;
  }
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    response->set_found(false);
    return grpc::Status::OK;
  }
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_found(true);
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status FleetService::StoreAdd(grpc::ServerContext* context, const fleet::v1::StoreAddRequest* request,
                                    fleet::v1::StoreAddResponse* response) {
  if (absl::Status allowed = RequireMember(context, "StoreAdd"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status FleetService::Report(grpc::ServerContext* context, const fleet::v1::ReadyReport* request,
                                  fleet::v1::ReportResponse*) {
  if (absl::Status allowed = RequireRank(context, "Report", request->fleet_rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<ReadyReport> report = ReadyReportFromProto(*request);
  if (!report.ok()) return ToGrpcStatus(report.status());
  return ToGrpcStatus(coordinator_->Report(std::move(*report)));
}

grpc::Status FleetService::Abort(grpc::ServerContext* context, const fleet::v1::AbortRequest* request,
                                 fleet::v1::AbortResponse*) {
  if (absl::Status allowed = RequireRank(context, "Abort", request->fleet_rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  return ToGrpcStatus(
      coordinator_->Abort(GroupKeyFromProto(request->key()), request->trainer_rank(),
                          absl::Status(static_cast<absl::StatusCode>(request->code()), request->message()),
                          request->submission(), request->fleet_rank(), request->incarnation()));
}

grpc::Status FleetService::ReadLog(grpc::ServerContext* context, const fleet::v1::ReadLogRequest* request,
                                   fleet::v1::ReadLogResponse* response) {
  if (absl::Status allowed = RequireRank(context, "ReadLog", request->reader()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  ReaderState reader;
  reader.rank = request->reader();
  reader.epoch = request->epoch();
  reader.incarnation = request->incarnation();
  reader.formed_generation = request->formed_generation();
  reader.failed_generation = request->failed_generation();
  for (const fleet::v1::ReadyReport& r : request->kept()) {
    absl::StatusOr<ReadyReport> report = ReadyReportFromProto(r);
    if (report.ok()) reader.kept.push_back(*std::move(report));
  }
  absl::StatusOr<std::vector<LogEntry>> entries =
      coordinator_->Read(reader, request->from(), WaitOf(request->timeout_ms()));
  if (!entries.ok()) return ToGrpcStatus(entries.status());
  if (entries->size() == 1) {
    *response->add_entries() = LogEntryToProto(entries->front());
    return grpc::Status::OK;
  }
  // Several (the reader is behind): as many as fit in max_read_bytes_, at least one.
  size_t bytes = 0;
  for (const LogEntry& entry : *entries) {
    fleet::v1::LogEntry proto = LogEntryToProto(entry);
    const size_t size = proto.ByteSizeLong();
    if (response->entries_size() > 0 && bytes + size > max_read_bytes_) break;
    bytes += size;
    *response->add_entries() = std::move(proto);
  }
  return grpc::Status::OK;
}

}  // namespace orthoserve
