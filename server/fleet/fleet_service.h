// The orthoserve.fleet.v1.Fleet gRPC service that fleet rank 0 serves to the other ranks: its
// Store and its Coordinator, carried over the wire. A thin adapter; thread-safe.
#pragma once

#include "orthoserve/fleet/v1/fleet.grpc.pb.h"
#include "server/collective/store.h"
#include "server/fleet/coordinator.h"

namespace orthoserve {

class FleetService final : public fleet::v1::Fleet::Service {
 public:
  // Neither is owned; both must outlive the service.
  FleetService(Store* store, Coordinator* coordinator) : store_(store), coordinator_(coordinator) {}

  grpc::Status Join(grpc::ServerContext* context, const fleet::v1::JoinRequest* request,
                    fleet::v1::JoinResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const fleet::v1::LeaveRequest* request,
                     fleet::v1::LeaveResponse* response) override;
  grpc::Status StoreSet(grpc::ServerContext* context, const fleet::v1::StoreSetRequest* request,
                        fleet::v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const fleet::v1::StoreGetRequest* request,
                        fleet::v1::StoreGetResponse* response) override;
  grpc::Status StoreAdd(grpc::ServerContext* context, const fleet::v1::StoreAddRequest* request,
                        fleet::v1::StoreAddResponse* response) override;
  grpc::Status Report(grpc::ServerContext* context, const fleet::v1::ReadyReport* request,
                      fleet::v1::ReportResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const fleet::v1::AbortRequest* request,
                     fleet::v1::AbortResponse* response) override;
  grpc::Status ReadLog(grpc::ServerContext* context, const fleet::v1::ReadLogRequest* request,
                       fleet::v1::ReadLogResponse* response) override;

 private:
  Store* store_;
  Coordinator* coordinator_;
};

}  // namespace orthoserve
