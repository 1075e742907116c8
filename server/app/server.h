// Server: one orthoserve rank — backend, metrics, fleet membership, the public gRPC service
// with health and reflection — built from Options. Start-up rejects bad combinations once,
// with a message that says which flag to change.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fair_pool.h"
#include "grpcpp/server.h"
#include "server/engine/backend.h"
#include "server/engine/backend_factory.h"
#include "server/app/connection_options.h"
#include "server/fleet/wire/fleet.h"
#include "server/etcd/etcd_options.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/orthogonalizer_service.h"
#include "server/rpc/shared_memory_service.h"
#include "server/shm/handover_socket.h"
#include "server/shm/region_registry.h"

namespace orthoserve {

// Health service name (public port) that is SERVING while this rank is a member of a formed
// fleet generation.
extern const char kFleetHealthService[];

// Shared-memory regions (docs/shared_memory.md): off unless `socket` is set.
struct ShmOptions {
  std::string socket;                 // --shm-socket: the handover socket's absolute path; empty: regions off.
  std::vector<uid_t> peer_uids;       // --shm-peer-uids: uids that may hand memfds over; empty: the server's own.
  int64_t max_region_bytes = int64_t{64} << 30;  // --shm-max-region-bytes: the largest memfd taken.
  int max_regions_per_tenant = 64;    // --shm-max-regions-per-tenant.
  int max_pending = 64;               // --shm-max-pending: memfds waiting for RegisterRegion.
  int max_connections = 1024;         // --shm-max-connections: lifelines held (one per region).
  int max_handshakes = 64;            // --shm-max-handshakes: connections whose message is being read.
  absl::Duration ticket_timeout = absl::Seconds(10);      // --shm-ticket-timeout.
  absl::Duration unregister_timeout = absl::Seconds(60);  // --shm-unregister-timeout.
  // --shm-allow-without-tokens: regions without a token file on a --listen that is not loopback
  // (every client that reaches the port is tenant "default"); refused at start unless set.
  bool allow_without_tokens = false;
};

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";      // Public gRPC address.
  std::string advertise_address;               // Address clients use for this rank; default: listen.
  std::string metrics_address = "127.0.0.1:9464";  // /metrics; empty disables.
  BackendOptions backend;                       // cpu|cuda and their settings.
  int workers = 2;                              // Concurrent compute jobs for lone clients.
  FairPool::Shares tenant_shares;               // Weights and priority classes of the compute queue.
  TenantLabels tenant_labels = TenantLabels::kOff;  // How per-tenant metrics name tenants.
  int rank = 0;                                 // Fleet rank.
  int world = 1;                                // Fleet size S.
  std::string coordinator;                      // Rank 0's fleet address (world > 1, static membership).
  // "static" (rank 0 coordinates) or "etcd://HOST:PORT[,...]/PREFIX" (an elected coordinator).
  std::string membership = "static";
  absl::Duration fleet_leader_ttl = absl::ZeroDuration();  // Elected: the lease TTL (zero: derived).
  etcd::EtcdOptions etcd;                                  // Elected: TLS files and timeouts (endpoints from membership).
  std::string fleet_listen;                     // Internal address (health, fleet service on rank 0, Gloo host).
  std::string collective = "auto";              // auto|gloo|nccl: the fleet's collective group (world > 1).
  ServiceOptions service;                       // Limits and reported settings.
  absl::Duration collective_timeout = absl::Seconds(60);
  absl::Duration stall_warning = absl::Seconds(60);
  int batch_window = 1;  // --fleet-batch-window (Fleet::Options::batch_window).
  absl::Duration batch_part_time = absl::Milliseconds(100);  // --fleet-batch-part-time.
  absl::Duration peer_timeout = absl::Seconds(15);   // A fleet peer silent this long is lost.
  int quarantine_after = 3;                          // --fleet-quarantine-after (Fleet::Options).
  absl::Duration quarantine_base = absl::Seconds(10);
  absl::Duration quarantine_max = absl::Minutes(5);
  // Largest log entry (a group step's plan) the coordinator appends (Fleet::Options::max_entry_bytes).
  int64_t fleet_max_log_entry_bytes = static_cast<int64_t>(kMaxFleetEntryBytes);
  absl::Duration drain_timeout = absl::Seconds(30);
  std::string tls_cert;       // PEM certificate chain; with tls_key enables TLS.
  std::string tls_key;        // PEM private key.
  std::string tls_client_ca;  // PEM CA bundle; set: clients must present a certificate (mTLS).
  absl::Duration tls_reload_interval = absl::Seconds(60);  // The TLS files are read again this often.
  FleetTlsOptions fleet_tls;  // --fleet-tls-*: mutual TLS between fleet members on the fleet port.
  std::string token_file;     // "TOKEN TENANT" lines; set: every call needs a bearer token.
  absl::Duration token_reload_interval = absl::Seconds(10);  // Token file looked at again (0: never).
  ConnectionOptions connections;  // --grpc-*: keepalive, client pings, idle and aged connections.
  ShmOptions shm;                 // --shm-*: shared-memory regions (off by default).
};

// Checks every option that can be checked without binding an address or starting the backend
// (what `orthoserve --check-config` runs). INVALID_ARGUMENT naming the flag.
absl::Status ValidateServerOptions(const ServerOptions& options);

// What valid options allow that an operator should know of (what --check-config prints and the
// server logs as warnings at start), one sentence each; empty for most configurations.
std::vector<std::string> ServerOptionsWarnings(const ServerOptions& options);

// The collective a fleet of these options joins: "local" for world 1 (no group), else --collective,
// with "auto" meaning "nccl" on --backend cuda and "gloo" on cpu. Assumes valid options.
std::string ResolveCollective(const ServerOptions& options);

class Server {
 public:
  // INVALID_ARGUMENT for a bad option, naming the flag; UNAVAILABLE if an address cannot be
  // bound; the backend's error if it cannot start.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  int port() const { return port_; }  // Bound public port (resolves ":0").
  int metrics_port() const { return metrics_->port(); }
  int fleet_port() const { return fleet_->fleet_port(); }
  Fleet& fleet() { return *fleet_; }
  size_t compute_queued() const { return compute_->queued(); }  // Compute jobs waiting for a worker.
  int inflight_calls() const;  // Orthogonalize and OrthogonalizeStream calls in progress.

  // Blocks until Drain() has finished.
  void Wait() ABSL_LOCKS_EXCLUDED(mu_);
  // Graceful stop: readiness off, new calls refused (UNAVAILABLE, which clients retry on
  // another rank), a graceful leave of the fleet (bounded by a few seconds: batches already
  // planned with this rank run, group steps waiting here fail with UNAVAILABLE and are retried
  // on the members that stay), calls in flight given until the drain timeout, then everything
  // torn down. Calls still running at the drain deadline are cancelled and end at once.
  // Idempotent; safe from any thread but a gRPC handler.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Server() = default;
  void WatchHealth() ABSL_LOCKS_EXCLUDED(mu_);

  ServerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<FairPool> compute_;
  std::unique_ptr<TokenAuth> auth_ = std::make_unique<TokenAuth>();
  std::unique_ptr<OrthogonalizerService> service_;
  std::unique_ptr<RegionRegistry> shm_registry_;    // Null: regions off.
  std::unique_ptr<HandoverSocket> shm_socket_;      // Null: regions off.
  std::unique_ptr<SharedMemoryService> shm_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  absl::Mutex mu_;
  absl::CondVar cv_;  // Signalled when draining_ or drained_ is set.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  std::thread health_;
};

}  // namespace orthoserve
