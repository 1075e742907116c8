// Implementation of server/fleet/fleet_service.h.
#include "server/fleet/fleet_service.h"

#include <algorithm>

#include "proto/convert/grpc_status.h"
#include "server/fleet/fleet_codec.h"

namespace orthoserve {
namespace {

// Long polls are cut at this length so a peer notices a dead coordinator quickly.
constexpr int64_t kMaxWaitMs = 10000;

absl::Duration WaitOf(int64_t timeout_ms) {
  return absl::Milliseconds(std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs));
}

}  // namespace

grpc::Status FleetService::StoreSet(grpc::ServerContext*, const fleet::v1::StoreSetRequest* request,
                                    fleet::v1::StoreSetResponse*) {
  return ToGrpcStatus(store_->Set(request->key(), request->value()));
}

grpc::Status FleetService::StoreGet(grpc::ServerContext*, const fleet::v1::StoreGetRequest* request,
                                    fleet::v1::StoreGetResponse* response) {
  absl::StatusOr<std::string> value = store_->Get(request->key(), WaitOf(request->timeout_ms()));
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    response->set_found(false);
    return grpc::Status::OK;
  }
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_found(true);
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status FleetService::StoreAdd(grpc::ServerContext*, const fleet::v1::StoreAddRequest* request,
                                    fleet::v1::StoreAddResponse* response) {
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status FleetService::Report(grpc::ServerContext*, const fleet::v1::ReadyReport* request,
                                  fleet::v1::ReportResponse*) {
  absl::StatusOr<ReadyReport> report = ReadyReportFromProto(*request);
  if (!report.ok()) return ToGrpcStatus(report.status());
  coordinator_->Report(std::move(*report));
  return grpc::Status::OK;
}

grpc::Status FleetService::Abort(grpc::ServerContext*, const fleet::v1::AbortRequest* request,
                                 fleet::v1::AbortResponse*) {
  coordinator_->Abort(GroupKeyFromProto(request->key()), request->trainer_rank(),
                      absl::Status(static_cast<absl::StatusCode>(request->code()), request->message()));
  return grpc::Status::OK;
}

grpc::Status FleetService::ReadLog(grpc::ServerContext*, const fleet::v1::ReadLogRequest* request,
                                   fleet::v1::ReadLogResponse* response) {
  for (const LogEntry& entry : coordinator_->Read(request->reader(), request->from(), WaitOf(request->timeout_ms()))) {
    *response->add_entries() = LogEntryToProto(entry);
  }
  return grpc::Status::OK;
}

}  // namespace orthoserve
