// Fleet: this process's membership in an elastic fleet of up to S server ranks (docs/architecture.md) —
// its identity, the rendezvous store, the coordinator (on rank 0) and the executor that runs
// the coordinator's log.
//
// Membership comes in generations decided by the coordinator (coordinator.h): a rank joins,
// takes part in every generation that lists it (joining that generation's collective group,
// whose store prefix carries the coordinator's epoch and the generation), and drops out when it
// leaves, dies, restarts or stops answering — the other ranks go on in the next generation.
// Nothing of an old generation can be joined or confused with a new one.
//
// Static coordinator (the default): rank 0 serves the orthoserve.fleet.v1 service on its fleet
// address; the other ranks reach it there (with fleet TLS over mutual TLS, each member proving
// its rank with its certificate). When rank 0 itself is gone, the others cannot serve group
// steps (UNAVAILABLE, which clients retry) but serve lone clients on their own until it is
// back; they then join its new epoch. S = 1 (the embedded default) needs no network: the
// coordinator is local and the collective is LocalCollective.
//
// Elected coordinator (Options::election, --membership etcd://...): every rank serves the fleet
// service and campaigns in etcd (etcd_leadership.h); the elected rank runs a coordinator whose
// epoch is its leadership term, with its own rendezvous store, and the others follow whichever
// rank etcd names (leader_link.h). When the coordinator is lost a survivor is elected within the
// lease TTL, every member joins it (re-advertising the steps it keeps, so retried steps replay)
// and it forms the next generation from them. A coordinator that leaves (SIGTERM) resigns at
// once, so its successor takes over without waiting for the TTL. While etcd is unreachable the
// fleet goes on with the coordinator it has. Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "server/collective/in_memory_store.h"
#include "server/collective/store.h"
#include "server/engine/backend.h"
#include "server/fleet/logic/coordinator.h"
#include "server/fleet/logic/executor.h"
#include "server/fleet/wire/fleet_access.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/fleet/logic/group_step.h"
#include "server/fleet/logic/log_source.h"
#include "server/fleet/logic/lone_placement.h"
#include "server/fleet/wire/peer.h"
#include "server/fleet/logic/step_fleet.h"
#include "server/metrics/metrics.h"
#include "server/etcd/etcd_options.h"
#include "server/fleet/wire/etcd_leadership.h"
#include "server/fleet/wire/fleet_service.h"
#include "server/fleet/wire/leader_link.h"

namespace orthoserve {

// How this rank finds the fleet's coordinator now (GetServerInfo, metrics).
struct FleetCoordinatorInfo {
  bool elected = false;    // etcd elects it (false: rank 0, static).
  int rank = -1;           // The coordinating rank (-1: none known yet).
  int64_t term = 0;        // Elected: its leadership term (0: none yet).
  bool etcd_reachable = true;                        // Elected: etcd answered this rank's last check.
  absl::Time etcd_unreachable_since = absl::InfiniteFuture();
  std::string etcd_error;                            // Elected: the last error, while unreachable.
};

struct FleetMemberInfo {
  int rank = 0;
  std::string address;  // Public HOST:PORT (the last one known; empty if never seen).
  bool ready = false;   // A member of the current generation.
};

class Fleet final : public StepFleet {
 public:
  struct Options {
    int rank = 0;                          // This rank, 0 <= rank < world.
    int world = 1;                         // S: the fleet's full size (ranks 0..S-1).
    std::string coordinator;               // Rank 0's fleet HOST:PORT; required when world > 1.
    std::string fleet_listen;              // This rank's internal address: grpc health on every rank, the
                                           // fleet service on rank 0, and the host Gloo binds. Empty: none
                                           // (allowed only for world 1).
    std::string advertise_address;         // This rank's public HOST:PORT, listed to clients.
    absl::Duration rendezvous_timeout = absl::Seconds(60);
    absl::Duration collective_timeout = absl::Seconds(60);
    absl::Duration stall_warning = absl::Seconds(60);
    absl::Duration peer_timeout = absl::Seconds(15);  // Silence after which a peer (or the coordinator) is lost.
    // Quarantine of a rank that keeps failing to join (Coordinator::Options; the window is a
    // minute, or four formation timeouts if longer).
    int quarantine_after = 3;
    absl::Duration quarantine_base = absl::Seconds(10);
    absl::Duration quarantine_max = absl::Minutes(5);
    std::string collective = "gloo";       // world > 1: "gloo" (TCP) or "nccl" (this rank's GPU `device`).
    int device = 0;                        // CUDA device ordinal for nccl.
    Backend* backend = nullptr;            // Not owned.
    Metrics* metrics = nullptr;            // Optional, not owned.
    // The order of group batches (Coordinator "Order of batches"): batches appended ahead of
    // rank 0's executor at most (0: in the order they complete), and tenants' shares.
    int batch_window = 1;
    absl::Duration batch_part_time = absl::Milliseconds(100);  // Coordinator::Options::part_time.
    FairShares tenant_shares;
    // Group steps of one tenant waiting for their trainer ranks at once (Coordinator::Options; 0: no limit).
    int max_tenant_pending_steps = 256;
    // Largest log entry the coordinator appends (Coordinator::Options::max_entry_bytes), at most
    // kMaxFleetEntryBytes (server/fleet/wire/fleet_codec.h).
    size_t max_entry_bytes = kMaxFleetEntryBytes;
    // The server's compute queue: members of a fleet of S > 1 compute lone clients' matrices
    // forwarded by other members in it (the Peer service). Not owned; may be null (no Peer service).
    FairPool* compute = nullptr;
    // An elected coordinator (--membership etcd://HOSTS/PREFIX): `coordinator` is then unused and
    // every rank may coordinate. Disabled: rank 0 coordinates.
    struct Election {
      bool enabled = false;
      etcd::EtcdOptions etcd;
      std::string prefix;                          // The fleet's keys in etcd.
      absl::Duration ttl = absl::ZeroDuration();   // Leadership lease TTL; zero: max(1 s, peer_timeout / 2).
    } election;
    // The fleet port's mutual TLS (--fleet-tls-*; server/fleet/wire/fleet_tls.h): when enabled, the
    // fleet port (fleet service, Peer service, health) and every channel to it speak mutual TLS
    // and only members are let in (fleet_access.h). Not enabled: plaintext, trusting anyone.
    FleetTlsOptions tls;
  };

  // INVALID_ARGUMENT for inconsistent options (naming the flag), fleet TLS files included;
  // UNAVAILABLE when the fleet address cannot be bound. A one-rank fleet is formed when this
  // returns; a larger one forms in the background.
  static absl::StatusOr<std::unique_ptr<Fleet>> Create(const Options& options);
  ~Fleet();

  // StepFleet.
  int rank() const override { return options_.rank; }
  int world() const override { return options_.world; }
  bool ready() const override;
  bool takes_group_steps() const override;
  // The generation this rank is in (0: none), and how many members it has.
  int64_t generation() const;
  size_t generation_size() const;
  // The fleet port's health service (its "" status is the liveness signal); null without a
  // fleet port.
  grpc::HealthCheckServiceInterface* liveness_service() const;
  // OK unless this rank is wedged (see Executor::Liveness); drives the fleet port's health,
  // which the liveness probe checks.
  absl::Status Liveness() const;
  // Every rank 0..S-1, ordered by rank; `ready` marks the current generation's members.
  std::vector<FleetMemberInfo> members() const ABSL_LOCKS_EXCLUDED(mu_);
  // The port the fleet address bound (resolves ":0"); 0 without one.
  int fleet_port() const { return fleet_port_; }

  // Replaces this rank's advertised address once its real port is known (one-rank fleets only,
  // where nobody else has read it yet).
  void SetLocalAddress(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  // StepFleet: through the executor (Executor::Submit / AbortStep).
  void Submit(std::shared_ptr<TrainerStep> step, StepCallback done) override;
  void AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission) override;
  // Steps waiting in the executor.
  size_t waiting() const;

  // StepFleet: on a formed fleet of S > 1, the member the LonePlacement policy picks among the
  // generation's members; otherwise this rank. ComputeOnPeer calls the member's Peer service.
  std::shared_ptr<const LoneTarget> PickLoneRank(double cost) override;
  void ComputeOnPeer(const LoneTarget& target, const PeerMatrix& matrix,
                     std::function<void(absl::StatusOr<PeerResult>)> done) override;
  // Lone matrices this rank has computed for itself and sent to peers since it started.
  int64_t lone_here() const { return lone_.here(); }
  int64_t lone_forwarded() const { return lone_.forwarded(); }

  // How this rank finds the coordinator now.
  FleetCoordinatorInfo coordinator_info() const;

  // Graceful leave before shutdown (rolling update, node drain): see Executor::Leave. A static
  // rank 0 leaves the membership too, but goes on coordinating until it shuts down (it cannot
  // hand the coordinator over; its peers see it go then). An elected coordinator stops its
  // executor and resigns, so a successor is elected at once; any other rank stops campaigning
  // and leaves through the coordinator.
  absl::Status Leave(absl::Duration timeout);
  // Stops the executor (failing what still waits) and the coordinator.
  void Shutdown();

 private:
  explicit Fleet(const Options& options)
      : options_(options), self_address_(options.advertise_address), addresses_(options.world) {}
  absl::Status ServeFleetPort();
  CollectiveFactory MakeCollectiveFactory() const;
  Coordinator::Options CoordinatorOptions(uint64_t epoch, int home_rank) const;
  // The fleet address other ranks reach this one at (its host, the bound fleet port).
  std::string FleetAddress() const;
  // Elected coordinator: starts the campaign and keeps this process's (`incarnation`) liveness key;
  // the callbacks below carry its outcome out.
  absl::Status StartElection(uint64_t incarnation);
  void Elected(int64_t term) ABSL_LOCKS_EXCLUDED(mu_);
  void Deposed(int64_t term) ABSL_LOCKS_EXCLUDED(mu_);
  void LeaderIs(const LeaderInfo& leader) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<const CoordinatorSeat> seat() const ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  std::shared_ptr<const FleetTls> tls_;  // Null without fleet TLS.
  std::unique_ptr<FleetAccess> access_;  // Who may call the fleet port; outlives its services.
  std::shared_ptr<Store> store_;  // Shared with joins that may outlive a generation.
  std::shared_ptr<InMemoryStore> served_store_;  // Rank 0: store_, which the fleet service serves.
  std::unique_ptr<Coordinator> coordinator_;  // Rank 0 only.
  LonePlacement lone_{options_.rank};
  std::unique_ptr<PeerClient> peers_;
  std::unique_ptr<grpc::Service> fleet_service_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<grpc::Server> fleet_server_;
  std::unique_ptr<LogSource> log_;          // Static: the coordinator's.
  std::unique_ptr<LeaderLink> link_;        // Elected: where the elected coordinator is.
  std::unique_ptr<EtcdLeadership> leadership_;
  std::unique_ptr<Executor> executor_;
  int fleet_port_ = 0;
  std::atomic<bool> shutdown_{false};

  mutable absl::Mutex mu_;
  std::string self_address_ ABSL_GUARDED_BY(mu_);                   // This rank's advertised address.
  // Elected: this rank's seat while it coordinates, and every seat it held before (kept until
  // the fleet goes: a call answered late may hold one; see SeatSource).
  std::shared_ptr<const CoordinatorSeat> seat_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const CoordinatorSeat>> retired_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);  // Last known address by rank.
};

}  // namespace orthoserve
