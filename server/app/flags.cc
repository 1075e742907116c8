// Implementation of server/app/flags.h.
#include "server/app/flags.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/fleet/wire/fleet_codec.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "Public gRPC address HOST:PORT (port 0 picks a free port).");
ABSL_FLAG(std::string, advertise_address, "",
          "Address clients use to reach this rank, listed by GetServerInfo; default: --listen.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "Prometheus /metrics HTTP address HOST:PORT; empty disables the endpoint.");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu (OpenBLAS) or cuda (one GPU).");
ABSL_FLAG(int, device, 0, "GPU ordinal for --backend cuda.");
ABSL_FLAG(int64_t, device_memory_budget, 0, "Bytes of GPU memory the cuda backend may hold; 0 = 90% of free memory.");
ABSL_FLAG(std::string, collective, "auto",
          "The fleet's collective group when --world > 1: gloo (TCP, any backend), nccl (one GPU per rank, --backend "
          "cuda) or auto (nccl on cuda, gloo on cpu).");
ABSL_FLAG(bool, cuda_graphs, false,
          "--backend cuda: replay each Newton-Schulz step loop as a CUDA graph (captured once per shape and buffers; "
          "same results, fewer launches).");
ABSL_FLAG(int, workers, 2, "Concurrent compute jobs for lone clients (matrices computed at once).");
ABSL_FLAG(int, blas_threads, 1, "OpenBLAS threads per product (cpu backend).");
ABSL_FLAG(std::string, rank, "0",
          "This rank in the fleet, or \"auto\": from ORTHOSERVE_POD_INDEX or the trailing -N of $HOSTNAME.");
ABSL_FLAG(int, world, 1, "Number of fleet ranks S; 1 runs a self-contained server.");
ABSL_FLAG(std::string, coordinator, "",
          "Rank 0's fleet address HOST:PORT; required when --world > 1 with --membership static.");
ABSL_FLAG(std::string, membership, "static",
          "Who coordinates the fleet: \"static\" (rank 0, reached at --coordinator; the default) or "
          "\"etcd://HOST:PORT[,HOST:PORT...]/PREFIX\": every rank campaigns in etcd (3.4 or later) under PREFIX and "
          "the elected one coordinates; when it is lost a survivor is elected within --fleet-leader-ttl "
          "(docs/operations.md, \"Elected coordinator\").");
ABSL_FLAG(absl::Duration, fleet_leader_ttl, absl::ZeroDuration(),
          "With --membership etcd://: the TTL of each rank's etcd lease, so the longest a lost coordinator holds "
          "up the fleet before a successor is elected. 0: half the --fleet-peer-timeout, at least 1s.");
ABSL_FLAG(std::string, etcd_tls_ca, "", "With --membership etcd://: PEM roots that sign etcd's certificate (TLS).");
ABSL_FLAG(std::string, etcd_tls_cert, "", "With --membership etcd://: PEM client certificate for etcd (mutual TLS).");
ABSL_FLAG(std::string, etcd_tls_key, "", "With --membership etcd://: PEM private key for --etcd-tls-cert.");
ABSL_FLAG(std::string, fleet_listen, "",
          "Internal fleet address HOST:PORT (required when --world > 1): every rank answers gRPC health there "
          "(liveness), rank 0 serves the fleet service, and Gloo binds on its host. Empty: none.");
ABSL_FLAG(int64_t, max_matrix_elements, int64_t{1} << 28, "Largest matrix accepted, in elements (global shape).");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{4} << 30, "Matrix bytes the server holds in flight at most.");
ABSL_FLAG(int64_t, max_tenant_inflight_bytes, int64_t{2} << 30, "Matrix bytes one tenant holds in flight at most.");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "Concurrent OrthogonalizeStream calls at most. With a token file they are shared fairly: a slot is kept "
          "free for each tenant without streams, and tenants with streams get shares weighted by --tenant-shares; a "
          "tenant takes more than its share only while no other tenant refused lately needs the slot.");
ABSL_FLAG(int, max_tenant_concurrent_streams, 0,
          "Concurrent OrthogonalizeStream calls of one tenant at most, a cap on top of its fair share of "
          "--max-concurrent-streams (0: no cap).");
ABSL_FLAG(int, max_concurrent_unary, 0,
          "Concurrent Orthogonalize (unary) calls at most, shared fairly between tenants like the stream slots "
          "(--tenant-shares); more wait in a queue (--max-unary-waiters). 0: as many as --max-inflight-bytes holds "
          "reservations for (2 x --max-message-bytes each, or the tenant's or server's whole budget if smaller).");
ABSL_FLAG(int, max_tenant_concurrent_unary, 0,
          "Concurrent unary calls of one tenant at most, a cap on top of its fair share of --max-concurrent-unary "
          "(0: no cap); more wait in the queue.");
ABSL_FLAG(int, max_unary_waiters, 256,
          "Unary calls waiting for a slot at most. The queue is fair between tenants: slots go to the waiting tenant "
          "with the fewest per weight, and when the queue is full a tenant under its weighted part of it pushes out "
          "the newest waiter of the tenant most over its part; other calls are refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, max_tenant_calls_per_second, 0,
          "Calls (streams and unary) one tenant may start in any second; more are refused with RESOURCE_EXHAUSTED "
          "(0: no limit).");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20, "Largest gRPC message sent or received.");
ABSL_FLAG(int64_t, chunk_bytes, int64_t{4} << 20, "Largest DataChunk.data accepted; results go out in chunks under 4 MiB (gRPC's default receive limit) unless a client asks for larger ones, up to this.");
ABSL_FLAG(int64_t, stream_buffer_idle_bytes, int64_t{512} << 20,
          "Bytes of released stream matrix buffers kept for reuse by later steps (at most --max-inflight-bytes); 0 "
          "keeps none.");
ABSL_FLAG(int, max_matrices_per_step, 4096, "Matrices in one step or unary call at most.");
ABSL_FLAG(int, max_name_bytes, 1024,
          "Longest matrix name, and longest job, group and run_id of a step header, in bytes; longer ones are "
          "refused with INVALID_ARGUMENT before anything is allocated for them.");
ABSL_FLAG(int, max_shape_dims, 16,
          "Dims of one matrix shape at most; more are refused with INVALID_ARGUMENT before the shape is copied.");
ABSL_FLAG(int, max_group_world, 16384,
          "Trainer ranks of one group step (StepHeader.world) at most, up to 65536; more are refused with "
          "INVALID_ARGUMENT.");
ABSL_FLAG(int, max_tenant_pending_steps, 256,
          "Group steps of one tenant waiting on the fleet for their trainer ranks at once; more are refused with "
          "RESOURCE_EXHAUSTED (0: no limit).");
ABSL_FLAG(int64_t, fleet_max_log_entry_bytes, static_cast<int64_t>(orthoserve::kMaxFleetEntryBytes),
          "Fleets of several ranks: the largest plan of a group step the coordinator puts into the fleet's log, in "
          "bytes as encoded (an upper bound is estimated); a larger one fails its step with INVALID_ARGUMENT. At most "
          "the default, which keeps every entry readable within the fleet port's 256 MiB message limit.");
ABSL_FLAG(bool, allow_group_steps_without_run_id, false,
          "Serve group steps (world > 1) whose header has no run_id (clients that predate run ids, grpcurl) as one "
          "run of their own: they never share a step with a run that has an id, but two such runs of one job can "
          "share one, so this is for migrating old clients only. Default: refuse them with INVALID_ARGUMENT.");
ABSL_FLAG(absl::Duration, rendezvous_timeout, absl::Seconds(60),
          "How long a group step waits for all its trainer ranks before it is aborted.");
ABSL_FLAG(absl::Duration, stream_progress_timeout, absl::Seconds(60),
          "A stream waiting on its client (for its next message, or for it to read its results) with nothing happening "
          "for this long is ended: RESOURCE_EXHAUSTED for a client that stopped sending, CANCELLED for one that stopped "
          "reading. Waiting on the server (compute, a group's rendezvous) does not count. 0: never.");
ABSL_FLAG(int64_t, stream_min_progress_bytes, int64_t{16} << 10,
          "A stream waiting on its client that moves fewer bytes than this (sent by the client, or read by it) in "
          "--stream-progress-timeout is ended, so a trickle holds no slot either. 0: only a stream that moves "
          "nothing at all.");
ABSL_FLAG(absl::Duration, grpc_keepalive_time, absl::Seconds(30),
          "The public port pings a client connection quiet for this long, and closes it when the ping is not answered "
          "within --grpc-keepalive-timeout (a vanished client gives back its streams).");
ABSL_FLAG(absl::Duration, grpc_keepalive_timeout, absl::Seconds(10), "See --grpc-keepalive-time.");
ABSL_FLAG(absl::Duration, grpc_min_client_ping_interval, absl::Seconds(1),
          "Clients may send keepalive pings this often (with or without calls); more often twice: GOAWAY.");
ABSL_FLAG(absl::Duration, grpc_max_connection_idle, absl::Hours(1),
          "A client connection without calls for this long is closed (the client reconnects); 0: never.");
ABSL_FLAG(absl::Duration, grpc_max_connection_age, absl::ZeroDuration(),
          "A client connection this old is asked to go away (its calls get --grpc-max-connection-age-grace); 0: never.");
ABSL_FLAG(absl::Duration, grpc_max_connection_age_grace, absl::Minutes(5), "See --grpc-max-connection-age.");
ABSL_FLAG(int, grpc_max_streams_per_connection, 256,
          "Concurrent calls on one client connection at most (the stream limits apply on top); 0: no limit.");
ABSL_FLAG(int64_t, grpc_memory_quota_bytes, 0,
          "Memory gRPC may hold for the public port (its resource quota): received messages not yet consumed, "
          "transport and flow-control buffers. Near it gRPC shrinks its HTTP/2 windows and closes idle connections; "
          "at it, calls are cancelled with RESOURCE_EXHAUSTED. 0: --max-inflight-bytes + 8 MiB per unary call that may "
          "hold a slot or wait (--max-concurrent-unary + --max-unary-waiters) + 64 MiB. At least 16 MiB.");
ABSL_FLAG(bool, grpc_bdp_probe, false,
          "Size the public port's HTTP/2 windows from each connection's measured bandwidth-delay product. false: "
          "fixed 64 KiB initial windows, so a call waiting for a slot or room holds at most 64 KiB of its request in "
          "gRPC's buffers (calls being read still get a window for the message they read). true: each new call may be "
          "sent 4 MiB or more of its request before the server reads it, beyond the admission limits.");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(60), "Timeout of each fleet collective call.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30), "How long SIGTERM waits for calls in flight (after leaving the fleet); the process exits at "
          "this plus 10s at the latest.");
ABSL_FLAG(absl::Duration, fleet_peer_timeout, absl::Seconds(15),
          "A fleet rank (or the coordinator) unheard of this long counts as lost: the others go on in the next "
          "generation without it and take it back when it returns.");
ABSL_FLAG(int, fleet_quarantine_after, 3,
          "A fleet rank that fails to join this many generations' collectives within a minute (or four formation "
          "timeouts, if longer) is left out of the next generation for a while (a quarantine that doubles each time, "
          "from --fleet-quarantine-base to --fleet-quarantine-max), so the others form a working generation without "
          "it. 0: never.");
ABSL_FLAG(absl::Duration, fleet_quarantine_base, absl::Seconds(10), "A fleet rank's first quarantine.");
ABSL_FLAG(absl::Duration, fleet_quarantine_max, absl::Minutes(5), "A fleet rank's longest quarantine.");
ABSL_FLAG(int, fleet_batch_window, 1,
          "Fleets of several ranks: group batches appended to the fleet's log ahead of rank 0 at most; complete steps "
          "wait in a queue weighted fair between tenants (--tenant-shares) and their jobs. 0: batches run in the order "
          "their steps complete.");
ABSL_FLAG(absl::Duration, fleet_batch_part_time, absl::Milliseconds(100),
          "Fleets of several ranks, with --fleet-batch-window > 0: a group step of several matrices goes into the "
          "fleet's log in parts of about this much work (at least one matrix per member), so that other tenants' steps "
          "run between them; results do not change. 0: whole steps.");
ABSL_FLAG(absl::Duration, stall_warning, absl::Seconds(60), "Warn about trainer ranks missing for this long.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls-key serves TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA bundle; when set, clients must present a certificate (mutual TLS).");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "--tls-cert, --tls-key and --tls-client-ca, and --fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca, are "
          "read again this often; new connections get what they hold "
          "(a certificate whose key does not match is not taken), connections already made keep theirs. At least 1s.");
ABSL_FLAG(std::string, fleet_tls_cert, "",
          "PEM certificate chain of this rank for mutual TLS on the fleet port (with --fleet-tls-key and "
          "--fleet-tls-ca): it must carry this rank's --fleet-tls-member-name. Without the three the fleet port is "
          "plaintext and trusts anything that reaches it.");
ABSL_FLAG(std::string, fleet_tls_key, "", "PEM private key for --fleet-tls-cert.");
ABSL_FLAG(std::string, fleet_tls_ca, "",
          "PEM CA bundle that signs every fleet member's certificate: the fleet port admits only certificates it "
          "signed, and only as the ranks they name.");
ABSL_FLAG(std::string, fleet_tls_member_name, "orthoserve-rank-{rank}",
          "With fleet TLS: the DNS name that fleet rank r's certificate carries as a subject alternative name, {rank} "
          "replaced by r (a wildcard SAN covers one leftmost label). Without {rank} it is one name for the whole "
          "fleet, and any member's certificate may claim any rank (weaker).");
ABSL_FLAG(std::string, token_file, "", "File of \"TOKEN TENANT\" lines; when set, every call needs a bearer token.");
ABSL_FLAG(absl::Duration, token_reload_interval, absl::Seconds(10),
          "The token file is looked at this often and read again when it changed (added tokens work, removed ones are "
          "refused; calls in flight go on; a file that does not read or holds no tokens is not taken). 0: never.");
ABSL_FLAG(std::string, tenant_labels, "off",
          "How the per-tenant metrics (orthoserve_tenant_*) name tenants: off (every tenant is \"all\"), name (the "
          "token file's names) or hash (a stable pseudonym of the name).");
ABSL_FLAG(std::string, tenant_shares, "",
          "Compute shares of tenants, \"NAME=WEIGHT[@PRIORITY],...\": the compute queue serves backlogged tenants in "
          "proportion to WEIGHT (default 1) and a higher PRIORITY class (default 0) first; the jobs of a tenant "
          "share its part equally. Tenants are the token file's names (\"default\" without a token file).");
ABSL_FLAG(std::string, shm_socket, "",
          "Absolute path of a Unix domain socket on which clients on this host hand memfds over to register "
          "shared-memory regions (docs/shared_memory.md). Empty (default): regions are off and every SharedMemory "
          "call is refused. A stale socket there is removed at start and the socket at exit.");
ABSL_FLAG(std::string, shm_peer_uids, "",
          "Comma-separated uids that may hand memfds over on --shm-socket (SO_PEERCRED); empty: the server's own.");
ABSL_FLAG(int64_t, shm_max_region_bytes, int64_t{64} << 30, "Largest memfd registered as a region.");
ABSL_FLAG(int32_t, shm_max_regions_per_tenant, 64, "Shared-memory regions one tenant may have registered.");
ABSL_FLAG(int32_t, shm_max_pending, 64, "Memfds handed over and not yet registered, all clients together.");
ABSL_FLAG(int32_t, shm_max_connections, 1024,
          "Handover connections held open, all clients together: each staged or registered region's lifeline, "
          "whose end (the client closing it or dying) drops the region. A handover beyond it is refused.");
ABSL_FLAG(int32_t, shm_max_handshakes, 64,
          "Hand-over connections the server reads at once, all clients together: each accepted (its uid already "
          "checked) and given 1s for its message; one beyond it is refused with RESOURCE_EXHAUSTED at once.");
ABSL_FLAG(absl::Duration, shm_ticket_timeout, absl::Seconds(10),
          "How long a handed-over memfd waits for its RegisterRegion before it is dropped.");
ABSL_FLAG(absl::Duration, shm_unregister_timeout, absl::Seconds(60),
          "Longest an UnregisterRegion waits for the steps using the region (less when the call's deadline is).");
ABSL_FLAG(bool, shm_allow_without_tokens, false,
          "Serve shared-memory regions (--shm-socket) without --token-file on a --listen that is not loopback, where "
          "every client that reaches the port is tenant \"default\" and can list, read and write every region. "
          "Without it that configuration is refused at start; with it the server warns.");
ABSL_FLAG(std::string, log_level, "info", "Lowest level logged: debug, info, warning or error.");
ABSL_FLAG(std::string, log_verbose, "", "Per-subsystem verbosity, e.g. \"rpc=2,fleet=1\".");
ABSL_FLAG(bool, check_config, false, "Validate the flags and environment, print the configuration and exit.");

namespace orthoserve {
namespace {

const char* const kFlagNames[] = {
    "listen", "advertise_address", "metrics_address", "backend", "device", "device_memory_budget", "cuda_graphs", "collective", "workers",
    "blas_threads", "rank", "world", "coordinator", "membership", "fleet_leader_ttl", "etcd_tls_ca", "etcd_tls_cert",
    "etcd_tls_key", "fleet_listen", "max_matrix_elements", "max_inflight_bytes",
    "max_tenant_inflight_bytes", "max_concurrent_streams", "max_tenant_concurrent_streams", "max_tenant_calls_per_second", "max_concurrent_unary", "max_tenant_concurrent_unary", "max_unary_waiters", "max_message_bytes", "chunk_bytes",
    "stream_buffer_idle_bytes",
    "max_matrices_per_step", "max_name_bytes", "max_shape_dims", "max_group_world", "max_tenant_pending_steps",
    "fleet_max_log_entry_bytes",
    "allow_group_steps_without_run_id", "rendezvous_timeout", "stream_progress_timeout", "stream_min_progress_bytes", "grpc_keepalive_time", "grpc_keepalive_timeout", "grpc_min_client_ping_interval", "grpc_max_connection_idle", "grpc_max_connection_age", "grpc_max_connection_age_grace", "grpc_max_streams_per_connection", "grpc_memory_quota_bytes", "grpc_bdp_probe", "collective_timeout", "drain_timeout", "fleet_peer_timeout", "fleet_quarantine_after", "fleet_quarantine_base", "fleet_quarantine_max", "fleet_batch_window", "fleet_batch_part_time", "stall_warning", "tls_cert", "tls_reload_interval",
    "tls_key", "tls_client_ca", "fleet_tls_cert", "fleet_tls_key", "fleet_tls_ca", "fleet_tls_member_name",
    "token_file", "token_reload_interval", "tenant_shares", "tenant_labels", "shm_socket", "shm_peer_uids", "shm_max_region_bytes", "shm_max_regions_per_tenant",
    "shm_max_pending", "shm_max_connections", "shm_max_handshakes", "shm_ticket_timeout", "shm_unregister_timeout", "shm_allow_without_tokens", "log_level", "log_verbose", "check_config"};

absl::StatusOr<FairPool::Shares> ParseTenantShares(absl::string_view text) {
  FairPool::Shares shares;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    FairPool::Share share;
    absl::string_view weight = eq == absl::string_view::npos ? "" : entry.substr(eq + 1);
    const size_t at = weight.find('@');
    if (at != absl::string_view::npos) {
      if (!absl::SimpleAtoi(weight.substr(at + 1), &share.priority)) weight = "";
      weight = weight.substr(0, at);
    }
    if (eq == 0 || eq == absl::string_view::npos || !absl::SimpleAtod(weight, &share.weight) ||
        !(share.weight > 0) || !std::isfinite(share.weight)) {
      return absl::InvalidArgumentError(absl::StrCat("--tenant-shares entry \"", entry,
                                                     "\" is not NAME=WEIGHT[@PRIORITY] with WEIGHT > 0"));
    }
    if (!shares.emplace(std::string(entry.substr(0, eq)), share).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tenant-shares names tenant \"", entry.substr(0, eq), "\" twice"));
    }
  }
  return shares;
}

absl::StatusOr<int> ResolveRank(const std::string& text) {
  int rank = 0;
  if (text != "auto") {
    if (!absl::SimpleAtoi(text, &rank)) {
      return absl::InvalidArgumentError(absl::StrCat("--rank \"", text, "\" is not an integer or \"auto\""));
    }
    return rank;
  }
  if (const char* index = std::getenv("ORTHOSERVE_POD_INDEX"); index != nullptr && *index != '\0') {
    if (!absl::SimpleAtoi(index, &rank)) {
      return absl::InvalidArgumentError(absl::StrCat("ORTHOSERVE_POD_INDEX \"", index, "\" is not an integer"));
    }
    return rank;
  }
  const char* host = std::getenv("HOSTNAME");
  std::string name = host != nullptr ? host : "";
  size_t dash = name.rfind('-');
  if (dash == std::string::npos || !absl::SimpleAtoi(name.substr(dash + 1), &rank)) {
    return absl::InvalidArgumentError(absl::StrCat("--rank auto: neither ORTHOSERVE_POD_INDEX nor a trailing -N in "
                                                   "HOSTNAME \"", name, "\" gives the rank"));
  }
  return rank;
}

}  // namespace

absl::Status ApplyEnvironmentFallbacks() {
  for (const char* name : kFlagNames) {
    std::string variable = absl::StrCat("ORTHOSERVE_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(variable, "=\"", value, "\": ", error));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.backend.kind = absl::GetFlag(FLAGS_backend);
  o.backend.device = absl::GetFlag(FLAGS_device);
  o.backend.device_memory_budget = absl::GetFlag(FLAGS_device_memory_budget);
  o.backend.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.backend.cpu_threads = absl::GetFlag(FLAGS_blas_threads);
  o.workers = absl::GetFlag(FLAGS_workers);
  ASSIGN_OR_RETURN(o.tenant_shares, ParseTenantShares(absl::GetFlag(FLAGS_tenant_shares)));
  RETURN_IF_ERROR(Annotate(ParseTenantLabels(absl::GetFlag(FLAGS_tenant_labels), &o.tenant_labels), "--tenant-labels"));
  ASSIGN_OR_RETURN(o.rank, ResolveRank(absl::GetFlag(FLAGS_rank)));
  o.world = absl::GetFlag(FLAGS_world);
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.membership = absl::GetFlag(FLAGS_membership);
  o.fleet_leader_ttl = absl::GetFlag(FLAGS_fleet_leader_ttl);
  o.etcd.tls_ca_file = absl::GetFlag(FLAGS_etcd_tls_ca);
  o.etcd.tls_cert_file = absl::GetFlag(FLAGS_etcd_tls_cert);
  o.etcd.tls_key_file = absl::GetFlag(FLAGS_etcd_tls_key);
  o.fleet_listen = absl::GetFlag(FLAGS_fleet_listen);
  o.collective = absl::GetFlag(FLAGS_collective);
  o.service.max_matrix_elements = absl::GetFlag(FLAGS_max_matrix_elements);
  o.service.admission.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  o.service.admission.max_tenant_inflight_bytes = absl::GetFlag(FLAGS_max_tenant_inflight_bytes);
  o.service.admission.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.service.admission.max_tenant_concurrent_streams = absl::GetFlag(FLAGS_max_tenant_concurrent_streams);
  o.service.admission.max_tenant_calls_per_second = absl::GetFlag(FLAGS_max_tenant_calls_per_second);
  o.service.unary.max_concurrent = absl::GetFlag(FLAGS_max_concurrent_unary);
  o.service.unary.max_tenant_concurrent = absl::GetFlag(FLAGS_max_tenant_concurrent_unary);
  o.service.unary.max_waiters = absl::GetFlag(FLAGS_max_unary_waiters);
  o.service.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.service.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  o.service.buffers.max_idle_bytes = absl::GetFlag(FLAGS_stream_buffer_idle_bytes);
  o.service.max_matrices_per_step = absl::GetFlag(FLAGS_max_matrices_per_step);
  o.service.max_name_bytes = absl::GetFlag(FLAGS_max_name_bytes);
  o.service.max_shape_dims = absl::GetFlag(FLAGS_max_shape_dims);
  o.service.max_group_world = absl::GetFlag(FLAGS_max_group_world);
  o.service.max_tenant_pending_steps = absl::GetFlag(FLAGS_max_tenant_pending_steps);
  o.fleet_max_log_entry_bytes = absl::GetFlag(FLAGS_fleet_max_log_entry_bytes);
  o.service.allow_group_steps_without_run_id = absl::GetFlag(FLAGS_allow_group_steps_without_run_id);
  o.service.rendezvous_timeout = absl::GetFlag(FLAGS_rendezvous_timeout);
  o.service.stream_progress_timeout = absl::GetFlag(FLAGS_stream_progress_timeout);
  o.service.stream_min_progress_bytes = absl::GetFlag(FLAGS_stream_min_progress_bytes);
  o.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  o.connections.keepalive_time = absl::GetFlag(FLAGS_grpc_keepalive_time);
  o.connections.keepalive_timeout = absl::GetFlag(FLAGS_grpc_keepalive_timeout);
  o.connections.min_client_ping_interval = absl::GetFlag(FLAGS_grpc_min_client_ping_interval);
  o.connections.max_connection_idle = absl::GetFlag(FLAGS_grpc_max_connection_idle);
  o.connections.max_connection_age = absl::GetFlag(FLAGS_grpc_max_connection_age);
  o.connections.max_connection_age_grace = absl::GetFlag(FLAGS_grpc_max_connection_age_grace);
  o.connections.max_streams_per_connection = absl::GetFlag(FLAGS_grpc_max_streams_per_connection);
  o.connections.memory_quota_bytes = absl::GetFlag(FLAGS_grpc_memory_quota_bytes);
  o.connections.bdp_probe = absl::GetFlag(FLAGS_grpc_bdp_probe);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  o.stall_warning = absl::GetFlag(FLAGS_stall_warning);
  o.peer_timeout = absl::GetFlag(FLAGS_fleet_peer_timeout);
  o.quarantine_after = absl::GetFlag(FLAGS_fleet_quarantine_after);
  o.quarantine_base = absl::GetFlag(FLAGS_fleet_quarantine_base);
  o.quarantine_max = absl::GetFlag(FLAGS_fleet_quarantine_max);
  o.batch_window = absl::GetFlag(FLAGS_fleet_batch_window);
  o.batch_part_time = absl::GetFlag(FLAGS_fleet_batch_part_time);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.tls_reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  o.fleet_tls.cert_file = absl::GetFlag(FLAGS_fleet_tls_cert);
  o.fleet_tls.key_file = absl::GetFlag(FLAGS_fleet_tls_key);
  o.fleet_tls.ca_file = absl::GetFlag(FLAGS_fleet_tls_ca);
  o.fleet_tls.member_name = absl::GetFlag(FLAGS_fleet_tls_member_name);
  o.fleet_tls.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.token_reload_interval = absl::GetFlag(FLAGS_token_reload_interval);
  o.shm.socket = absl::GetFlag(FLAGS_shm_socket);
  for (absl::string_view uid : absl::StrSplit(absl::GetFlag(FLAGS_shm_peer_uids), ',', absl::SkipWhitespace())) {
    uint32_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(uid), &value)) {
      return absl::InvalidArgumentError(absl::StrCat("--shm-peer-uids: \"", uid, "\" is not a uid"));
    }
    o.shm.peer_uids.push_back(static_cast<uid_t>(value));
  }
  o.shm.max_region_bytes = absl::GetFlag(FLAGS_shm_max_region_bytes);
  o.shm.max_regions_per_tenant = absl::GetFlag(FLAGS_shm_max_regions_per_tenant);
  o.shm.max_pending = absl::GetFlag(FLAGS_shm_max_pending);
  o.shm.max_connections = absl::GetFlag(FLAGS_shm_max_connections);
  o.shm.max_handshakes = absl::GetFlag(FLAGS_shm_max_handshakes);
  o.shm.ticket_timeout = absl::GetFlag(FLAGS_shm_ticket_timeout);
  o.shm.unregister_timeout = absl::GetFlag(FLAGS_shm_unregister_timeout);
  o.shm.allow_without_tokens = absl::GetFlag(FLAGS_shm_allow_without_tokens);

  LogLevel level;
  RETURN_IF_ERROR(Annotate(ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level), "--log-level"));
  SetLogLevel(level);
  RETURN_IF_ERROR(Annotate(SetLogVerbosity(absl::GetFlag(FLAGS_log_verbose)), "--log-verbose"));
  RETURN_IF_ERROR(ValidateServerOptions(o));
  return o;
}

bool CheckConfigRequested() { return absl::GetFlag(FLAGS_check_config); }

std::string DescribeFlags() {
  std::string out;
  for (const char* name : kFlagNames) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    absl::StrAppend(&out, "--", absl::StrReplaceAll(name, {{"_", "-"}}), " = ", flag->CurrentValue(), "\n");
  }
  return out;
}

}  // namespace orthoserve
