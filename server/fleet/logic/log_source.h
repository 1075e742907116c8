// LogSource: how a fleet rank reaches the coordinator — joins and leaves the membership,
// reports readiness, aborts steps and reads the ordered log (its heartbeat). In process for
// rank 0 (LocalLogSource); over the fleet gRPC service for the other ranks (RemoteLogSource in
// fleet_client.h). Every call is bounded in time. Errors: UNAVAILABLE when the coordinator
// cannot be reached (or is shutting down); FAILED_PRECONDITION when this rank must join again
// (the coordinator restarted, or dropped this incarnation); the rest as Coordinator documents.
// Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "server/fleet/logic/coordinator.h"

namespace orthoserve {

class LogSource {
 public:
  struct Joined {
    uint64_t epoch = 0;    // The coordinator's epoch.
    int64_t log_from = 0;  // Where this rank starts reading.
  };

  virtual ~LogSource() = default;
  virtual absl::StatusOr<Joined> Join(const Member& me) = 0;
  virtual absl::Status Leave(int rank, uint64_t incarnation, uint64_t epoch) = 0;
  virtual absl::Status Report(const ReadyReport& report) = 0;
  // Sent by fleet rank `fleet_rank` (this rank), incarnation `incarnation`: see Coordinator::Abort.
  virtual absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                             int fleet_rank, uint64_t incarnation) = 0;
  // Entries from index `from`, waiting up to `timeout` for one; empty on timeout.
  virtual absl::StatusOr<std::vector<LogEntry>> Read(const ReaderState& reader, int64_t from,
                                                     absl::Duration timeout) = 0;
};

// The coordinator in this process. Does not own it.
class LocalLogSource final : public LogSource {
 public:
  explicit LocalLogSource(Coordinator* coordinator) : coordinator_(coordinator) {}
  absl::StatusOr<Joined> Join(const Member& me) override {
    ASSIGN_OR_RETURN(int64_t from, coordinator_->Join(me));
    return Joined{coordinator_->epoch(), from};
  }
  absl::Status Leave(int rank, uint64_t incarnation, uint64_t epoch) override {
    return coordinator_->Leave(rank, incarnation, epoch);
  }
  absl::Status Report(const ReadyReport& report) override { return coordinator_->Report(report); }
  absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                     int fleet_rank, uint64_t incarnation) override {
    return coordinator_->Abort(key, trainer_rank, reason, submission, fleet_rank, incarnation);
  }
  absl::StatusOr<std::vector<LogEntry>> Read(const ReaderState& reader, int64_t from, absl::Duration timeout) override {
    return coordinator_->Read(reader, from, timeout);
  }

 private:
  Coordinator* coordinator_;
};

}  // namespace orthoserve
