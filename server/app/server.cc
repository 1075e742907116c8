// Implementation of server/app/server.h.
#include "server/app/server.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server_builder.h"
#include "server/app/listen_address.h"
#include "server/etcd/etcd_options.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/logic/fleet_identity.h"
#include "server/fleet/wire/fleet_tls.h"
#include "server/metrics/certificate_expiry.h"
#include "server/tls/watched_tls.h"
#include "server/rpc/service_state.h"
#include "server/shm/ipc_region.h"

namespace orthoserve {
namespace {

// A graceful leave waits this long at most for the generation without this rank.
constexpr absl::Duration kLeaveTimeout = absl::Seconds(5);

}  // namespace

const char kFleetHealthService[] = "orthoserve.fleet";

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  if (o.tls_cert.empty()) {
    if (!o.tls_client_ca.empty()) return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    return grpc::InsecureServerCredentials();
  }
  // Read once here so that a missing or unreadable file is an error at start, not a server
  // whose handshakes all fail.
  RETURN_IF_ERROR(ReadFile(o.tls_key, "--tls-key").status());
  RETURN_IF_ERROR(ReadFile(o.tls_cert, "--tls-cert").status());
  if (!o.tls_client_ca.empty()) RETURN_IF_ERROR(ReadFile(o.tls_client_ca, "--tls-client-ca").status());
  if (o.tls_reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls-reload-interval must be at least 1s");
  }
  // Read again every interval (server/tls/watched_tls.h), so rotated certificates take effect
  // without a restart.
  return WatchedServerCredentials(
      WatchTlsFiles({o.tls_key, o.tls_cert, o.tls_client_ca, o.tls_reload_interval}), !o.tls_client_ca.empty());
}

// The certificates this rank serves with, as (label, PEM file): the expiry metric's and the
// liveness check's.
std::vector<std::pair<std::string, std::string>> ServingCertificates(const ServerOptions& o) {
  std::vector<std::pair<std::string, std::string>> files;
  if (!o.tls_cert.empty()) files.emplace_back("server", o.tls_cert);
  if (!o.tls_client_ca.empty()) files.emplace_back("client_ca", o.tls_client_ca);
  if (!o.fleet_tls.cert_file.empty()) files.emplace_back("fleet", o.fleet_tls.cert_file);
  if (!o.fleet_tls.ca_file.empty()) files.emplace_back("fleet_ca", o.fleet_tls.ca_file);
  return files;
}

// Whether shared-memory regions are served to any client that reaches a public port beyond this
// host, without tokens: every such client is tenant "default" and may use every region.
bool RegionsOpenToTheNetwork(const ServerOptions& o) {
  return !o.shm.socket.empty() && o.token_file.empty() && !IsLoopbackListenAddress(o.listen);
}

}  // namespace

std::string ResolveCollective(const ServerOptions& o) {
  if (o.world == 1) return "local";
  if (o.collective != "auto") return o.collective;
  return o.backend.kind == "cuda" && ORTHOSERVE_WITH_CUDA ? "nccl" : "gloo";
}

absl::Status ValidateServerOptions(const ServerOptions& o) {
  if (o.listen.empty()) return absl::InvalidArgumentError("--listen is empty; give HOST:PORT");
  if (o.backend.kind != "cpu" && o.backend.kind != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--backend \"", o.backend.kind, "\" is not one of cpu, cuda"));
  }
  if (o.backend.cpu_threads < 1) return absl::InvalidArgumentError("--blas-threads must be >= 1");
  if (o.world < 1) return absl::InvalidArgumentError(absl::StrCat("--world = ", o.world, " must be >= 1"));
  if (o.rank < 0 || o.rank >= o.world) {
    return absl::InvalidArgumentError(absl::StrCat("--rank = ", o.rank, " is out of range for --world = ", o.world));
  }
  if (o.world > 1 && o.fleet_listen.empty()) {
    return absl::InvalidArgumentError("--fleet-listen is required when --world > 1: give this rank's internal HOST:PORT");
  }
  if (o.membership != "static" && !absl::StartsWith(o.membership, "etcd://")) {
    return absl::InvalidArgumentError(absl::StrCat("--membership \"", o.membership,
                                                   "\" is not static or etcd://HOST:PORT[,HOST:PORT...]/PREFIX"));
  }
  if (o.membership != "static") {
    RETURN_IF_ERROR(Annotate(etcd::ParseEtcdUrl(o.membership).status(), "--membership"));
    if (o.fleet_listen.empty()) {
      return absl::InvalidArgumentError("--membership etcd:// needs --fleet-listen (where this rank coordinates if elected)");
    }
    if (!o.coordinator.empty()) {
      return absl::InvalidArgumentError("--coordinator and --membership etcd:// exclude each other: etcd elects the coordinator");
    }
    if (o.fleet_leader_ttl != absl::ZeroDuration() && o.fleet_leader_ttl < absl::Seconds(1)) {
      return absl::InvalidArgumentError("--fleet-leader-ttl must be 0 (derived) or at least 1s (etcd's minimum)");
    }
  } else if (o.world > 1 && o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator is required when --world > 1: give rank 0's --fleet-listen (or elect one: --membership etcd://...)");
  }
  if (o.service.rendezvous_timeout <= absl::ZeroDuration() || o.collective_timeout <= absl::ZeroDuration() ||
      o.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--rendezvous-timeout and --collective-timeout must be positive");
  }
  if (o.peer_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("--fleet-peer-timeout must be positive");
  RETURN_IF_ERROR(ValidateConnectionOptions(o.connections));
  if (o.service.stream_min_progress_bytes < 0) {
    return absl::InvalidArgumentError("--stream-min-progress-bytes must be >= 0 (0: only a stream that moves nothing)");
  }
  if (o.quarantine_after < 0) return absl::InvalidArgumentError("--fleet-quarantine-after must be >= 0 (0: never)");
  if (o.quarantine_base <= absl::ZeroDuration() || o.quarantine_max < o.quarantine_base) {
    return absl::InvalidArgumentError(
        "--fleet-quarantine-base must be positive and --fleet-quarantine-max at least --fleet-quarantine-base");
  }
  if (o.batch_window < 0) return absl::InvalidArgumentError("--fleet-batch-window must be 0 or more");
  if (o.batch_part_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--fleet-batch-part-time must be 0 or more");
  }
  if (o.collective != "auto" && o.collective != "gloo" && o.collective != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--collective \"", o.collective, "\" is not one of auto, gloo, nccl"));
  }
  if (o.collective == "nccl" && o.backend.kind != "cuda") {
    return absl::InvalidArgumentError("--collective nccl needs --backend cuda (one GPU per rank); use gloo on cpu");
  }
  if (o.collective == "nccl" && !ORTHOSERVE_WITH_CUDA) {
    return absl::FailedPreconditionError(
        "--collective nccl: this build has no NCCL; rebuild with -DORTHOSERVE_WITH_CUDA=ON or use --collective gloo");
  }
  if (o.service.max_message_bytes < 4096 || o.service.max_message_bytes > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError("--max-message-bytes must be between 4096 and 2^31 - 1");
  }
  if (o.service.max_matrices_per_step < 1) return absl::InvalidArgumentError("--max-matrices-per-step must be >= 1");
  if (o.service.max_name_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-name-bytes = ", o.service.max_name_bytes, " must be >= 1"));
  }
  if (o.service.max_shape_dims < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-shape-dims = ", o.service.max_shape_dims, " must be >= 2 (a matrix has two dims)"));
  }
  if (o.service.max_group_world < 1 || o.service.max_group_world > kMaxGroupWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-group-world = ", o.service.max_group_world, " must be between 1 and ", kMaxGroupWorld));
  }
  if (o.fleet_max_log_entry_bytes < 1 || o.fleet_max_log_entry_bytes > static_cast<int64_t>(kMaxFleetEntryBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("--fleet-max-log-entry-bytes = ", o.fleet_max_log_entry_bytes,
                                                   " must be between 1 and ", kMaxFleetEntryBytes));
  }
  if (o.service.max_tenant_pending_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-tenant-pending-steps = ", o.service.max_tenant_pending_steps,
                                                   " must be >= 0 (0: no per-tenant limit)"));
  }
  if (o.workers < 1) return absl::InvalidArgumentError(absl::StrCat("--workers = ", o.workers, " must be >= 1"));
  if (o.service.buffers.max_idle_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--stream-buffer-idle-bytes = ", o.service.buffers.max_idle_bytes,
                                                   " must be >= 0"));
  }
  if (o.service.chunk_bytes < 1024 || o.service.chunk_bytes > o.service.max_message_bytes / 2) {
    return absl::InvalidArgumentError(absl::StrCat("--chunk-bytes = ", o.service.chunk_bytes,
                                                   " must be at least 1024 and at most half of --max-message-bytes (",
                                                   o.service.max_message_bytes, ")"));
  }
  if (o.service.max_matrix_elements < 1) return absl::InvalidArgumentError("--max-matrix-elements must be >= 1");
  if (o.service.admission.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError("--max-concurrent-streams must be >= 1");
  }
  if (o.service.admission.max_tenant_concurrent_streams < 0) {
    return absl::InvalidArgumentError("--max-tenant-concurrent-streams must be >= 0 (0: no per-tenant limit)");
  }
  if (o.service.unary.max_concurrent < 0) {
    return absl::InvalidArgumentError("--max-concurrent-unary must be >= 0 (0: what --max-inflight-bytes holds)");
  }
  if (o.service.unary.max_tenant_concurrent < 0) {
    return absl::InvalidArgumentError("--max-tenant-concurrent-unary must be >= 0 (0: no per-tenant cap)");
  }
  if (o.service.unary.max_waiters < 0) {
    return absl::InvalidArgumentError("--max-unary-waiters must be >= 0 (0: refuse a unary call that finds no slot)");
  }
  const double call_rate = o.service.admission.max_tenant_calls_per_second;
  if (!(call_rate == 0 || call_rate >= 1)) {
    return absl::InvalidArgumentError("--max-tenant-calls-per-second must be 0 (no limit) or at least 1");
  }
  if (o.service.admission.max_inflight_bytes < 1 || o.service.admission.max_tenant_inflight_bytes < 1) {
    return absl::InvalidArgumentError("--max-inflight-bytes and --max-tenant-inflight-bytes must be >= 1");
  }
  RETURN_IF_ERROR(Credentials(o).status());
  RETURN_IF_ERROR(FleetMemberNames::Create(o.fleet_tls.member_name, o.world).status());
  if (o.fleet_tls.enabled()) {
    if (o.fleet_listen.empty()) {
      return absl::InvalidArgumentError("--fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca need --fleet-listen");
    }
    RETURN_IF_ERROR(FleetTls::Load(o.fleet_tls, o.world).status());
  }
  if (o.token_reload_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--token-reload-interval must be >= 0 (0: never read the token file again)");
  }
  if (!o.token_file.empty()) RETURN_IF_ERROR(TokenAuth::FromFile(o.token_file).status());
  if (!o.shm.socket.empty()) {
    if (o.shm.max_region_bytes < 1) return absl::InvalidArgumentError("--shm-max-region-bytes must be >= 1");
    if (o.shm.max_regions_per_tenant < 1) return absl::InvalidArgumentError("--shm-max-regions-per-tenant must be >= 1");
    if (o.shm.max_pending < 1) return absl::InvalidArgumentError("--shm-max-pending must be >= 1");
    if (o.shm.max_connections < 1) return absl::InvalidArgumentError("--shm-max-connections must be >= 1");
    if (o.shm.max_handshakes < 1) return absl::InvalidArgumentError("--shm-max-handshakes must be >= 1");
    if (o.shm.ticket_timeout <= absl::ZeroDuration() || o.shm.unregister_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--shm-ticket-timeout and --shm-unregister-timeout must be > 0");
    }
  }
  if (RegionsOpenToTheNetwork(o) && !o.shm.allow_without_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm-socket without --token-file on --listen ", o.listen,
        ", which is not loopback, would let every client that reaches the port list, read and write every "
        "shared-memory region as tenant \"default\": give a --token-file, listen on loopback (127.0.0.1:PORT, "
        "[::1]:PORT or localhost:PORT), or accept it with --shm-allow-without-tokens"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ServerOptionsWarnings(const ServerOptions& o) {
  std::vector<std::string> warnings;
  if (RegionsOpenToTheNetwork(o)) {
    warnings.push_back(absl::StrCat(
        "--shm-allow-without-tokens: --shm-socket without --token-file on --listen ", o.listen,
        " (not loopback): every client that reaches the port is tenant \"default\" and can list, read and write "
        "every shared-memory region"));
  }
  return warnings;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  ServerOptions& o = server->options_;
  RETURN_IF_ERROR(ValidateServerOptions(o));
  for (const std::string& warning : ServerOptionsWarnings(o)) LOG_WARNING("server") << warning;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, Credentials(o));
  if (!o.token_file.empty()) {
    ASSIGN_OR_RETURN(server->auth_, TokenAuth::FromFile(o.token_file, o.token_reload_interval));
  }
  // Fair stream slots between the token file's tenants, by their --tenant-shares weights.
  o.service.admission.tenants = server->auth_->tenants();
  o.service.admission.tenant_shares = o.tenant_shares;
  o.service.unary.tenants = o.service.admission.tenants;
  o.service.unary.tenant_shares = o.tenant_shares;

  ASSIGN_OR_RETURN(server->backend_, CreateBackend(o.backend));
  const BackendInfo info = server->backend_->Info();
  Metrics::Options m;
  m.address = o.metrics_address;
  m.version = ORTHOSERVE_VERSION;
  m.fleet_protocol = kFleetProtocol;
  m.backend = info.name;
  m.device = info.device;
  m.limits.inflight_bytes = o.service.admission.max_inflight_bytes;
  m.limits.tenant_inflight_bytes = o.service.admission.max_tenant_inflight_bytes;
  m.limits.concurrent_streams = o.service.admission.max_concurrent_streams;
  m.limits.tenant_concurrent_streams = o.service.admission.max_tenant_concurrent_streams;
  m.tenant_labels = o.tenant_labels;
  m.limits.chunk_bytes = o.service.chunk_bytes;
  m.limits.message_bytes = o.service.max_message_bytes;
  m.limits.matrix_elements = o.service.max_matrix_elements;
  m.limits.matrices_per_step = o.service.max_matrices_per_step;
  m.limits.name_bytes = o.service.max_name_bytes;
  m.limits.shape_dims = o.service.max_shape_dims;
  m.limits.group_world = o.service.max_group_world;
  m.limits.tenant_pending_steps = o.service.max_tenant_pending_steps;
  m.limits.compute_workers = o.workers;
  m.limits.rendezvous_timeout = o.service.rendezvous_timeout;
  m.limits.collective_timeout = o.collective_timeout;
  m.certificates = ServingCertificates(o);
  ASSIGN_OR_RETURN(server->metrics_, Metrics::Create(m));
  server->metrics_->device_memory("budget").Set(static_cast<double>(info.memory_budget_bytes));
  if (!o.shm.socket.empty()) {
    RegionRegistry::Options r;
    r.max_regions_per_tenant = o.shm.max_regions_per_tenant;
    r.max_region_bytes = o.shm.max_region_bytes;
    r.max_pending = o.shm.max_pending;
    r.ticket_timeout = o.shm.ticket_timeout;
    r.max_name_bytes = o.service.max_name_bytes;
    server->shm_registry_ = std::make_unique<RegionRegistry>(r);
    HandoverSocket::Options h;
    h.path = o.shm.socket;
    h.peer_uids = o.shm.peer_uids;
    // The files the server reads itself are never its socket.
    h.reserved_paths = {o.token_file,         o.tls_cert,          o.tls_key,          o.tls_client_ca,
                        o.fleet_tls.cert_file, o.fleet_tls.key_file, o.fleet_tls.ca_file};
    Metrics* metrics = server->metrics_.get();
    h.observe = [metrics](absl::string_view outcome) { metrics->ShmHandover(outcome); };
    h.max_lifelines = o.shm.max_connections;
    h.max_handshakes = o.shm.max_handshakes;
    const RegionRegistry* registry = server->shm_registry_.get();
    h.on_dropped = [metrics, registry](RegionRegistry::Dropped dropped) {
      metrics->ShmRegionDropped(dropped == RegionRegistry::Dropped::kStaged ? "owner_gone_unclaimed" : "owner_gone");
      SharedMemoryService::PublishTotals(*registry, metrics);
    };
    // GPU memory by CUDA IPC handle when the backend can open it on its device (cuda); a cpu
    // backend has no opener, and the socket refuses such handles with FAILED_PRECONDITION.
    IpcOpener* opener = server->backend_->ipc_opener();
    h.open_cuda_ipc = CudaIpcOpenFunction(opener);
    ASSIGN_OR_RETURN(server->shm_socket_, HandoverSocket::Start(h, server->shm_registry_.get()));
    o.service.shm_socket = o.shm.socket;
    if (opener != nullptr) o.service.shm_cuda_device = opener->device_uuid();
  }
  server->shm_service_ = std::make_unique<SharedMemoryService>(server->shm_registry_.get(), server->auth_.get(),
                                                               server->metrics_.get(), o.shm.unregister_timeout,
                                                               o.service.max_name_bytes);

  // The public port is bound before the fleet forms so that its real port can be advertised.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, credentials, &server->port_);
  // Without this gRPC binds with SO_REUSEPORT, and a second server on a busy port would start
  // silently and share its traffic; a port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.service.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.service.max_message_bytes));
  if (o.connections.memory_quota_bytes == 0) {
    const int64_t unary_calls = int64_t{UnaryGateOptions(o.service).max_concurrent} + o.service.unary.max_waiters;
    o.connections.memory_quota_bytes = DefaultMemoryQuota(o.service.admission.max_inflight_bytes, unary_calls);
  }
  ApplyConnectionOptions(o.connections, builder);

  server->compute_ = std::make_unique<FairPool>(o.workers, o.tenant_shares);
  // gRPC needs every service registered before it binds, and the service needs the fleet, so
  // the fleet starts first (formation runs in the background) and learns the bound port after.
  const bool ephemeral = o.listen.size() > 2 && o.listen.compare(o.listen.size() - 2, 2, ":0") == 0;
  if (o.world > 1 && o.advertise_address.empty() && ephemeral) {
    return absl::InvalidArgumentError("--listen with port 0 in a fleet of --world > 1 needs --advertise-address");
  }
  Fleet::Options f;
  f.rank = o.rank;
  f.world = o.world;
  f.coordinator = o.coordinator;
  f.fleet_listen = o.fleet_listen;
  f.advertise_address = o.advertise_address.empty() ? o.listen : o.advertise_address;
  f.rendezvous_timeout = o.service.rendezvous_timeout;
  f.collective_timeout = o.collective_timeout;
  f.stall_warning = o.stall_warning;
  f.batch_window = o.batch_window;
  f.batch_part_time = o.batch_part_time;
  f.peer_timeout = o.peer_timeout;
  f.quarantine_after = o.quarantine_after;
  f.quarantine_base = o.quarantine_base;
  f.quarantine_max = o.quarantine_max;
  f.max_tenant_pending_steps = o.service.max_tenant_pending_steps;
  f.max_entry_bytes = static_cast<size_t>(o.fleet_max_log_entry_bytes);
  f.collective = ResolveCollective(o);
  f.device = o.backend.device;
  f.backend = server->backend_.get();
  f.tenant_shares = o.tenant_shares;
  f.compute = server->compute_.get();
  f.tls = o.fleet_tls;
  if (o.membership != "static") {
    ASSIGN_OR_RETURN(etcd::EtcdUrl url, etcd::ParseEtcdUrl(o.membership));
    f.election.enabled = true;
    f.election.etcd = o.etcd;
    f.election.etcd.endpoints = url.endpoints;
    f.election.prefix = url.prefix;
    f.election.ttl = o.fleet_leader_ttl;
  }
  f.metrics = server->metrics_.get();
  o.service.version = ORTHOSERVE_VERSION;
  ASSIGN_OR_RETURN(server->fleet_, Fleet::Create(f));
  server->service_ = std::make_unique<OrthogonalizerService>(o.service, server->backend_.get(), server->fleet_.get(),
                                                             server->metrics_.get(), server->auth_.get(),
                                                             server->compute_.get(), server->shm_registry_.get());
  builder.RegisterService(server->service_.get());
  builder.RegisterCallbackGenericService(server->service_->generic_service());
  builder.RegisterService(server->shm_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--listen ", o.listen, " cannot be bound"));
  }
  if (ephemeral && o.advertise_address.empty()) {
    server->fleet_->SetLocalAddress(absl::StrCat(o.listen.substr(0, o.listen.size() - 1), server->port_));
  }
  LOG_INFO("server") << "orthoserve " << ORTHOSERVE_VERSION << " rank " << o.rank << "/" << o.world << " serving on "
                     << o.listen << " (port " << server->port_ << "), backend " << info.name << " (" << info.device
                     << "), collective " << f.collective << ", metrics " << (o.metrics_address.empty() ? "off" : o.metrics_address);
  Server* raw = server.get();
  server->health_ = std::thread([raw] { raw->WatchHealth(); });
  return server;
}

int Server::inflight_calls() const { return service_->inflight(); }

void Server::WatchHealth() {
  // The public port: "" and the Orthogonalizer service are SERVING while the rank takes calls
  // (every rank does, with lone clients served alone when it is outside the fleet); the
  // "orthoserve.fleet" service is SERVING while it is a member of a formed generation. The
  // fleet port's "" status is the liveness signal: NOT_SERVING when the rank is wedged, or when a
  // certificate it serves with has expired.
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  grpc::HealthCheckServiceInterface* liveness = fleet_->liveness_service();
  health->SetServingStatus(true);
  health->SetServingStatus("orthoserve.v1.Orthogonalizer", true);
  LOG_INFO("server") << "serving";
  int last_member = -1;
  bool last_live = true;
  std::string last_failure;
  const std::vector<std::pair<std::string, std::string>> certificate_files = ServingCertificates(options_);
  absl::Status certificates;
  absl::Time certificates_checked = absl::InfinitePast();
  absl::Time last = absl::Now();
  absl::MutexLock lock(&mu_);
  while (!draining_) {
    const int member = fleet_->ready() ? 1 : 0;
    if (member != last_member) {
      health->SetServingStatus(kFleetHealthService, member == 1);
      if (options_.world > 1) {
        LOG_INFO("server") << (member ? "fleet member: serving group steps" : "not a fleet member: serving lone clients alone");
      }
      last_member = member;
    }
    const absl::Time now = absl::Now();
    // An expired certificate fails liveness as it fails readiness (docs/operations.md, "Health
    // endpoints"): the files are looked at every 10 s, so a renewal read by the reload is seen.
    if (now - certificates_checked >= absl::Seconds(10)) {
      certificates = CertificatesUnexpired(certificate_files, now);
      certificates_checked = now;
    }
    absl::Status live = fleet_->Liveness();
    if (live.ok()) live = certificates;
    if (live.ok() != last_live || (!live.ok() && live.message() != last_failure)) {
      if (!live.ok()) LOG_ERROR("server") << "liveness fails: " << live;
      if (liveness != nullptr) liveness->SetServingStatus(live.ok());
      last_live = live.ok();
      last_failure = std::string(live.message());
    }
    if (options_.world > 1 && (!member || static_cast<int>(fleet_->generation_size()) < options_.world)) {
      metrics_->Degraded(now - last);
    }
    last = now;
    metrics_->device_memory("used").Set(static_cast<double>(backend_->DeviceMemoryInUseBytes()));
    const CopyCounts copies = backend_->Copies();
    metrics_->DeviceCopies("h2d", copies.h2d_bytes, copies.h2d_calls);
    metrics_->DeviceCopies("d2h", copies.d2h_bytes, copies.d2h_calls);
    metrics_->DeviceCopies("d2d", copies.d2d_bytes, copies.d2d_calls);
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(200));  // Woken early by Drain; the loop rechecks.
  }
}

void Server::Wait() {
  absl::MutexLock lock(&mu_);
  while (!drained_) cv_.Wait(&mu_);
}

void Server::Drain() {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return;
    draining_ = true;
    cv_.SignalAll();
  }
  if (server_ == nullptr) return;  // Create failed before the server started: nothing to drain.
  if (health_.joinable()) health_.join();
  LOG_INFO("server") << "draining: " << service_->inflight() << " calls in flight, up to "
                     << absl::FormatDuration(options_.drain_timeout);
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->GetHealthCheckService()->SetServingStatus(kFleetHealthService, false);
  service_->StartDraining();
  const absl::Time start = absl::Now();
  // Leave the fleet first: batches already planned with this rank still run here, group steps
  // still waiting here fail with UNAVAILABLE at once (their trainers retry on the members that
  // stay, rather than wait for this rank's drain), and no new batch includes this rank.
  absl::Status left_fleet = fleet_->Leave(std::min(options_.drain_timeout, kLeaveTimeout));
  if (!left_fleet.ok()) LOG_WARNING("server") << "leaving the fleet: " << left_fleet;
  // The calls in flight (lone clients computed here) finish; at the deadline the rest are
  // cancelled, and their handlers return at once.
  const absl::Duration left = std::max(absl::ZeroDuration(), options_.drain_timeout - (absl::Now() - start));
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(left));
  fleet_->Shutdown();
  LOG_INFO("server") << "drained in " << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)));
  absl::MutexLock lock(&mu_);
  drained_ = true;
  cv_.SignalAll();
}

Server::~Server() {
  Drain();
  server_.reset();
  shm_socket_.reset();  // Removes the socket file.
  shm_service_.reset();
  service_.reset();
  shm_registry_.reset();  // After every step: the regions' memory is unmapped here at the latest.
  fleet_.reset();
  compute_.reset();
}

}  // namespace orthoserve
