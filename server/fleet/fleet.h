// Fleet: this process's membership in a fleet of S server ranks (DESIGN §3) — its identity, the
// rendezvous store, the coordinator (on rank 0), the collective group and the executor that runs
// the coordinator's log. S = 1 (the embedded default) needs no network: the coordinator is local
// and the collective is LocalCollective.
//
// For S > 1, rank 0 serves the orthoserve.fleet.v1 service on its fleet address; every rank
// publishes its public address in the store, joins a collective group over the store (Gloo over
// TCP, or NCCL with one GPU per rank, its unique id passed through the store) and then reports
// ready. Formation runs in the background: until it completes, ready() is false and Submit
// fails with UNAVAILABLE. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "server/collective/collective.h"
#include "server/collective/store.h"
#include "server/engine/backend.h"
#include "server/fleet/coordinator.h"
#include "server/fleet/executor.h"
#include "server/fleet/group_step.h"
#include "server/fleet/log_source.h"
#include "server/metrics/metrics.h"

namespace orthoserve {

struct FleetMemberInfo {
  int rank = 0;
  std::string address;  // Public HOST:PORT.
  bool ready = false;
};

class Fleet {
 public:
  struct Options {
    int rank = 0;                          // This rank, 0 <= rank < world.
    int world = 1;                         // S.
    std::string coordinator;               // Rank 0's fleet HOST:PORT; required when world > 1.
    std::string fleet_listen;              // This rank's internal address: grpc health on every rank, the
                                           // fleet service on rank 0, and the host Gloo binds. Empty: none
                                           // (allowed only for world 1).
    std::string advertise_address;         // This rank's public HOST:PORT, listed to clients.
    absl::Duration rendezvous_timeout = absl::Seconds(60);
    absl::Duration collective_timeout = absl::Seconds(60);
    absl::Duration stall_warning = absl::Seconds(60);
    absl::Duration join_timeout = absl::Minutes(10);  // How long formation waits for peers.
    absl::Duration peer_timeout = absl::Seconds(15);  // Silence after which a peer counts as lost.
    std::string collective = "gloo";       // world > 1: "gloo" (TCP) or "nccl" (this rank's GPU `device`).
    int device = 0;                        // CUDA device ordinal for nccl.
    Backend* backend = nullptr;            // Not owned.
    Metrics* metrics = nullptr;            // Optional, not owned.
  };

  // INVALID_ARGUMENT for inconsistent options (naming the flag); UNAVAILABLE when rank 0 cannot
  // bind its fleet address.
  static absl::StatusOr<std::unique_ptr<Fleet>> Create(const Options& options);
  ~Fleet();

  int rank() const { return options_.rank; }
  int world() const { return options_.world; }
  bool ready() const { return ready_.load(); }
  // The formation error, if formation failed (the process should exit).
  absl::Status formation_status() const;

  // OK while the fleet is forming or formed and whole. UNAVAILABLE once it is lost for good: a
  // batch's collective failed, the coordinator stopped answering, or (on rank 0) a peer stopped
  // polling the log for --fleet-peer-timeout. The fleet does not re-form in place: a rank that
  // sees this exits so that its supervisor restarts it, and the ranks form a new fleet together.
  absl::Status Health() const;
  std::vector<FleetMemberInfo> members() const;
  // The port the fleet address bound (resolves ":0"); 0 without one.
  int fleet_port() const { return fleet_port_; }

  // Replaces this rank's advertised address once its real port is known (one-rank fleets only,
  // where nobody else has read it yet).
  void SetLocalAddress(const std::string& address);

  // See Executor::Submit / AbortStep. UNAVAILABLE while the fleet is not formed.
  void Submit(std::shared_ptr<TrainerStep> step, StepCallback done);
  void AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason);
  // Steps waiting in the executor.
  size_t waiting() const;

  void Shutdown();

 private:
  explicit Fleet(const Options& options) : options_(options) {}
  absl::Status ServeFleetPort();
  absl::Status Form();
  // Joins this rank's collective group (world > 1): Gloo or NCCL as Options::collective says.
  absl::StatusOr<std::unique_ptr<Collective>> JoinCollective();

  const Options options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;  // Rank 0 only.
  std::unique_ptr<grpc::Service> fleet_service_;
  std::unique_ptr<grpc::Server> fleet_server_;
  std::unique_ptr<LogSource> log_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<Executor> executor_;
  int fleet_port_ = 0;

  mutable std::mutex mu_;
  std::vector<FleetMemberInfo> members_;
  absl::Status formation_status_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> shutdown_{false};
  std::thread formation_;
};

}  // namespace orthoserve
