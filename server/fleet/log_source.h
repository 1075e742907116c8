// LogSource: how a fleet rank reaches the coordinator — reports readiness, aborts steps and
// reads the ordered log. In process for rank 0 (LocalLogSource); over the fleet gRPC service
// for the other ranks (RemoteLogSource in fleet_client.h). Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/fleet/coordinator.h"

namespace orthoserve {

class LogSource {
 public:
  virtual ~LogSource() = default;
  // UNAVAILABLE when the coordinator cannot be reached.
  virtual absl::Status Report(const ReadyReport& report) = 0;
  virtual absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason) = 0;
  // Entries from index `from`, waiting up to `timeout` for one; empty on timeout.
  virtual absl::StatusOr<std::vector<LogEntry>> Read(int reader, int64_t from, absl::Duration timeout) = 0;
};

// The coordinator in this process. Does not own it.
class LocalLogSource final : public LogSource {
 public:
  explicit LocalLogSource(Coordinator* coordinator) : coordinator_(coordinator) {}
  absl::Status Report(const ReadyReport& report) override {
    coordinator_->Report(report);
    return absl::OkStatus();
  }
  absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason) override {
    coordinator_->Abort(key, trainer_rank, reason);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<LogEntry>> Read(int reader, int64_t from, absl::Duration timeout) override {
    return coordinator_->Read(reader, from, timeout);
  }

 private:
  Coordinator* coordinator_;
};

}  // namespace orthoserve
