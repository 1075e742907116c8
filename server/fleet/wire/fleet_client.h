// Clients of the coordinator's fleet service, used by fleet ranks other than 0: a Store
// (GrpcStore, what Gloo and the NCCL bootstrap rendezvous through) and a LogSource
// (RemoteLogSource). Both map transport failures to UNAVAILABLE. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "orthoserve/fleet/v1/fleet.grpc.pb.h"
#include "server/collective/store.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/fleet/logic/log_source.h"

namespace orthoserve {

// A channel to the fleet address `address` of fleet rank `rank` (0: the coordinator). With
// `tls` it speaks mutual TLS, presenting this rank's certificate, and its handshake fails unless
// the server's certificate carries rank `rank`'s member name; without, it is plaintext (the fleet
// port then trusts anyone who reaches it, and the deployment's network policy is its only fence).
// `tls` is not owned and must outlive the call only. INVALID_ARGUMENT (with `tls`) for a rank
// that has no member name, outside [0, world): a rank read from etcd or from another rank's
// message may be anything.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeFleetChannel(const std::string& address,
                                                                const FleetTls* tls = nullptr, int rank = 0);

class GrpcStore final : public Store {
 public:
  explicit GrpcStore(std::shared_ptr<grpc::Channel> channel);
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  std::unique_ptr<fleet::v1::Fleet::Stub> stub_;
};

// Calls fail fast (no waiting for a connection) and are bounded: membership and step calls
// by a few seconds, a log read by its timeout plus a margin, so a dead coordinator is noticed
// within seconds and no caller blocks for long. CancelAll ends the calls in flight, and fails
// every later one, with UNAVAILABLE: the coordinator is somewhere else now (LeaderLink).
class RemoteLogSource final : public LogSource {
 public:
  explicit RemoteLogSource(std::shared_ptr<grpc::Channel> channel);
  ~RemoteLogSource() override;
  void CancelAll();
  absl::StatusOr<Joined> Join(const Member& me) override;
  absl::Status Leave(int rank, uint64_t incarnation, uint64_t epoch) override;
  absl::Status Report(const ReadyReport& report) override;
  absl::Status Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission,
                     int fleet_rank, uint64_t incarnation) override;
  absl::StatusOr<std::vector<LogEntry>> Read(const ReaderState& reader, int64_t from, absl::Duration timeout) override;

 private:
  class Tracked;  // One call's context, registered for CancelAll while the call runs.

  std::unique_ptr<fleet::v1::Fleet::Stub> stub_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve
