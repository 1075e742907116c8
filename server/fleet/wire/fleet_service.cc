// Implementation of server/fleet/wire/fleet_service.h.
#include "server/fleet/wire/fleet_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/convert/grpc_status.h"
#include "server/fleet/wire/fleet_codec.h"

namespace orthoserve {
namespace {

// Long polls are cut at this length so a peer notices a dead coordinator quickly.
constexpr int64_t kMaxWaitMs = 10000;

absl::Duration WaitOf(int64_t timeout_ms) {
  return absl::Milliseconds(std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs));
}

// Threads that encode ReadLog responses: a few, so that a large entry read by many members at
// once is encoded in parallel, as it was on the synchronous server's threads.
int EncoderThreads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 2u, 8u)); }

}  // namespace

FleetCalls::FleetCalls(SeatSource seats, size_t max_read_bytes, const FleetAccess* access)
    : seats_(std::move(seats)), max_read_bytes_(max_read_bytes), access_(access), encoder_(EncoderThreads()) {}

FleetCalls::FleetCalls(InMemoryStore* store, Coordinator* coordinator, size_t max_read_bytes,
                       const FleetAccess* access)
    : FleetCalls(
          [seat = std::make_shared<const CoordinatorSeat>(CoordinatorSeat{
               // Not owned: aliasing pointers with no owner.
               std::shared_ptr<Coordinator>(std::shared_ptr<void>(), coordinator),
               std::shared_ptr<InMemoryStore>(std::shared_ptr<void>(), store)})]() { return seat; },
          max_read_bytes, access) {}

absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> FleetCalls::Seat() const {
  std::shared_ptr<const CoordinatorSeat> seat = seats_();
  if (seat == nullptr || seat->coordinator == nullptr) {
    return absl::UnavailableError("this fleet rank is not the fleet's coordinator now (look it up again)");
  }
  return seat;
}

absl::Status FleetCalls::RequireRank(const grpc::ServerContextBase& context, absl::string_view call, int rank) const {
  return access_ == nullptr ? absl::OkStatus() : access_->RequireRank(context, call, rank);
}

absl::Status FleetCalls::RequireMember(const grpc::ServerContextBase& context, absl::string_view call) const {
  return access_ == nullptr ? absl::OkStatus() : access_->RequireMember(context, call);
}

absl::Status FleetCalls::RequireStore(const CoordinatorSeat& seat) {
  return seat.store != nullptr ? absl::OkStatus() : absl::UnavailableError("this fleet service has no store");
}

grpc::Status FleetCalls::Join(const grpc::ServerContextBase& context, const fleet::v1::JoinRequest& request,
                              fleet::v1::JoinResponse* response) {
  if (absl::Status allowed = RequireRank(context, "Join", request.member().rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  if (request.protocol() != kFleetProtocol) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "rank ", request.member().rank(), " speaks fleet protocol ", request.protocol(), " and this coordinator ",
        kFleetProtocol, ": ranks of different releases do not form a fleet")));
  }
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) return ToGrpcStatus(seat.status());
  Coordinator& coordinator = *(*seat)->coordinator;
  absl::StatusOr<int64_t> from = coordinator.Join(MemberFromProto(request.member()));
  if (!from.ok()) return ToGrpcStatus(from.status());
  response->set_epoch(coordinator.epoch());
  response->set_log_from(*from);
  response->set_protocol(kFleetProtocol);
  return grpc::Status::OK;
}

grpc::Status FleetCalls::Leave(const grpc::ServerContextBase& context, const fleet::v1::LeaveRequest& request) {
  if (absl::Status allowed = RequireRank(context, "Leave", request.rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) return ToGrpcStatus(seat.status());
  return ToGrpcStatus((*seat)->coordinator->Leave(request.rank(), request.incarnation(), request.epoch()));
}

grpc::Status FleetCalls::StoreSet(const grpc::ServerContextBase& context, const fleet::v1::StoreSetRequest& request) {
  if (absl::Status allowed = RequireMember(context, "StoreSet"); !allowed.ok()) return ToGrpcStatus(allowed);
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) return ToGrpcStatus(seat.status());
  if (absl::Status store = RequireStore(**seat); !store.ok()) return ToGrpcStatus(store);
  return ToGrpcStatus((*seat)->store->Set(request.key(), request.value()));
}

void FleetCalls::StoreGet(const grpc::ServerContextBase& context, const fleet::v1::StoreGetRequest& request,
                          fleet::v1::StoreGetResponse* response, Done done) {
  if (absl::Status allowed = RequireMember(context, "StoreGet"); !allowed.ok()) {
    done(ToGrpcStatus(allowed));
    return;
  }
  // The coordinator's protocol, for ranks to read before they join (fleet.proto, "Versions").
  if (request.key() == kFleetProtocolKey) {
    response->set_found(true);
    response->set_value(std::to_string(kFleetProtocol));
    done(grpc::Status::OK);
    return;
  }
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) {
    done(ToGrpcStatus(seat.status()));
    return;
  }
  if (absl::Status store = RequireStore(**seat); !store.ok()) {
    done(ToGrpcStatus(store));
    return;
  }
  // Waits in the store, which answers on its notifier thread: cheap work only here.
  InMemoryStore& store = *(*seat)->store;
  store.GetAsync(request.key(), WaitOf(request.timeout_ms()),
                   [seat = *seat, response, done = std::move(done)](absl::StatusOr<std::string> value) {
                     if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
                       response->set_found(false);
                       done(grpc::Status::OK);
                       return;
                     }
                     if (!value.ok()) {
                       done(ToGrpcStatus(value.status()));
                       return;
                     }
                     response->set_found(true);
                     response->set_value(*std::move(value));
                     done(grpc::Status::OK);
                   });
}

grpc::Status FleetCalls::StoreAdd(const grpc::ServerContextBase& context, const fleet::v1::StoreAddRequest& request,
                                  fleet::v1::StoreAddResponse* response) {
  if (absl::Status allowed = RequireMember(context, "StoreAdd"); !allowed.ok()) return ToGrpcStatus(allowed);
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) return ToGrpcStatus(seat.status());
  if (absl::Status store = RequireStore(**seat); !store.ok()) return ToGrpcStatus(store);
  absl::StatusOr<int64_t> value = (*seat)->store->Add(request.key(), request.delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status FleetCalls::Report(const grpc::ServerContextBase& context, const fleet::v1::ReadyReport& request) {
  if (absl::Status allowed = RequireRank(context, "Report", request.fleet_rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) return ToGrpcStatus(seat.status());
  absl::StatusOr<ReadyReport> report = ReadyReportFromProto(request, &spec_lists_);
  if (!report.ok()) return ToGrpcStatus(report.status());
  return ToGrpcStatus((*seat)->coordinator->Report(std::move(*report)));
}

grpc::Status FleetCalls::Abort(const grpc::ServerContextBase& context, const fleet::v1::AbortRequest& request) {
  if (absl::Status allowed = RequireRank(context, "Abort", request.fleet_rank()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) return ToGrpcStatus(seat.status());
  return ToGrpcStatus((*seat)->coordinator->Abort(GroupKeyFromProto(request.key()), request.trainer_rank(),
                                          absl::Status(static_cast<absl::StatusCode>(request.code()), request.message()),
                                          request.submission(), request.fleet_rank(), request.incarnation()));
}

void FleetCalls::Encode(const std::vector<SharedLogEntry>& entries, fleet::v1::ReadLogResponse* response) {
  // As many as fit in max_read_bytes_ (the reader may be behind), at least one.
  size_t bytes = 0;
  for (const SharedLogEntry& entry : entries) {
    const EncodedLog::Bytes encoded = encoded_.Encoded(entry);
    if (response->entries_size() > 0 && bytes + encoded->size() > max_read_bytes_) break;
    bytes += encoded->size();
    response->add_entries(*encoded);
  }
}

void FleetCalls::ReadLog(const grpc::ServerContextBase& context, const fleet::v1::ReadLogRequest& request,
                         fleet::v1::ReadLogResponse* response, Done done) {
  if (absl::Status allowed = RequireRank(context, "ReadLog", request.reader()); !allowed.ok()) {
    done(ToGrpcStatus(allowed));
    return;
  }
  ReaderState reader;
  reader.rank = request.reader();
  reader.epoch = request.epoch();
  reader.incarnation = request.incarnation();
  reader.formed_generation = request.formed_generation();
  reader.failed_generation = request.failed_generation();
  for (const fleet::v1::ReadyReport& r : request.kept()) {
    absl::StatusOr<ReadyReport> report = ReadyReportFromProto(r, &spec_lists_);
    if (report.ok()) reader.kept.push_back(*std::move(report));
  }
  absl::StatusOr<std::shared_ptr<const CoordinatorSeat>> seat = Seat();
  if (!seat.ok()) {
    done(ToGrpcStatus(seat.status()));
    return;
  }
  Coordinator& coordinator = *(*seat)->coordinator;
  coordinator.ReadAsync(
      reader, request.from(), WaitOf(request.timeout_ms()),
      [this, seat = *seat, response, done = std::move(done)](absl::StatusOr<std::vector<SharedLogEntry>> entries) mutable {
        if (!entries.ok()) {
          done(ToGrpcStatus(entries.status()));
          return;
        }
        if (entries->empty()) {
          done(grpc::Status::OK);
          return;
        }
        // Encoding may be large work (one entry of a big step is megabytes; once per entry, the
        // first reader's): on the pool, not on the coordinator's notifier thread.
        auto shared = std::make_shared<std::vector<SharedLogEntry>>(*std::move(entries));
        encoder_.Schedule([this, response, shared, done = std::move(done)] {
          Encode(*shared, response);
          done(grpc::Status::OK);
        });
      });
}

// ---------------------------------------------------------------------------------------------
// The gRPC adapter: every call finishes its default reactor with what FleetCalls says.

namespace {

FleetCalls::Done Finisher(grpc::ServerUnaryReactor* reactor) {
  return [reactor](grpc::Status status) { reactor->Finish(std::move(status)); };
}

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* FleetService::Join(grpc::CallbackServerContext* context, const fleet::v1::JoinRequest* request,
                                             fleet::v1::JoinResponse* response) {
  return Finished(context, calls_.Join(*context, *request, response));
}

grpc::ServerUnaryReactor* FleetService::Leave(grpc::CallbackServerContext* context,
                                              const fleet::v1::LeaveRequest* request, fleet::v1::LeaveResponse*) {
  return Finished(context, calls_.Leave(*context, *request));
}

grpc::ServerUnaryReactor* FleetService::StoreSet(grpc::CallbackServerContext* context,
                                                 const fleet::v1::StoreSetRequest* request,
                                                 fleet::v1::StoreSetResponse*) {
  return Finished(context, calls_.StoreSet(*context, *request));
}

grpc::ServerUnaryReactor* FleetService::StoreGet(grpc::CallbackServerContext* context,
                                                 const fleet::v1::StoreGetRequest* request,
                                                 fleet::v1::StoreGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  calls_.StoreGet(*context, *request, response, Finisher(reactor));
  return reactor;
}

grpc::ServerUnaryReactor* FleetService::StoreAdd(grpc::CallbackServerContext* context,
                                                 const fleet::v1::StoreAddRequest* request,
                                                 fleet::v1::StoreAddResponse* response) {
  return Finished(context, calls_.StoreAdd(*context, *request, response));
}

grpc::ServerUnaryReactor* FleetService::Report(grpc::CallbackServerContext* context,
                                               const fleet::v1::ReadyReport* request, fleet::v1::ReportResponse*) {
  return Finished(context, calls_.Report(*context, *request));
}

grpc::ServerUnaryReactor* FleetService::Abort(grpc::CallbackServerContext* context,
                                              const fleet::v1::AbortRequest* request, fleet::v1::AbortResponse*) {
  return Finished(context, calls_.Abort(*context, *request));
}

grpc::ServerUnaryReactor* FleetService::ReadLog(grpc::CallbackServerContext* context,
                                                const fleet::v1::ReadLogRequest* request,
                                                fleet::v1::ReadLogResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  calls_.ReadLog(*context, *request, response, Finisher(reactor));
  return reactor;
}

}  // namespace orthoserve
