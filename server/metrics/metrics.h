// Prometheus metrics of one server rank: a registry with every orthoserve_ family, the standard
// process_* metrics (process_collector.h), gauges of the configured limits (orthoserve_limit_*),
// typed accessors for the code that records, and an optional HTTP exposer at /metrics.
// docs/operations.md#metrics-and-alerts lists them all.
//
// Names carry the orthoserve_ prefix and base units (seconds, bytes); counters end in _total;
// histograms use the explicit buckets of metrics.cc. Thread-safe: prometheus-cpp metrics are
// atomic and label lookups (Family::Add) are internally locked.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/metrics/certificate_expiry.h"
#include "server/metrics/http_exposer.h"
#include "server/metrics/process_collector.h"

namespace orthoserve {

// Stages of a request whose durations are recorded (orthoserve_stage_duration_seconds{stage}).
enum class Stage { kReceive, kQueue, kRendezvous, kCollective, kCompute, kSend };
absl::string_view StageName(Stage stage);

// The values orthoserve_steps_aborted_total{reason} takes (Metrics::StepAborted), each series
// there from the start. timeout, cancelled, aborted and invalid are the coordinator's verdicts
// (server/fleet/logic/coordinator.h, kStepFailure*); collective and fleet_change the executor's.
inline constexpr const char* kStepAbortReasons[] = {"timeout",      "cancelled",       "aborted",
                                                    "invalid",      "collective",      "fleet_change",
                                                    "run_mismatch", "digest_mismatch", "limit"};

// The causes orthoserve_integrity_refusals_total{cause} counts (Metrics::IntegrityRefused), each
// series there from the start:
//  - run_mismatch: a group report of one run for a step another run's ranks were gathering
//    (rank 0, the coordinator);
//  - digest_mismatch: a retry whose blocks differ from the kept attempt it would be answered from
//    (rank 0);
//  - not_a_member: a fleet-port call from a peer whose certificate names no fleet member, or not
//    the rank it claims (the rank that served the call);
//  - limit: a request over a metadata limit (names, dims, matrices, world, pending steps, log
//    entry size; the rank that refused it);
//  - etcd_value: a value read from etcd that no rank of this fleet would write — a leader key
//    naming a rank outside --world, without a lease or not "<rank> <host:port>", a malformed
//    liveness key (each value once, on every rank that reads it).
inline constexpr const char* kIntegrityRefusalCauses[] = {"run_mismatch", "digest_mismatch", "not_a_member", "limit",
                                                          "etcd_value"};

// How tenants appear in the per-tenant families' `tenant` label (--tenant-labels). Tenant names
// can be customers' names, so they are shown only when asked for:
//  - kOff (default): every tenant is "all" (counters sum over tenants; the in-flight gauge holds
//    the largest tenant's figure, which is what a per-tenant limit is compared with);
//  - kName: the token file's tenant name;
//  - kHash: "t-" and 12 hex digits of a fixed 64-bit hash of the name (FNV-1a): stable across
//    ranks and restarts, pseudonymous rather than secret (a known name can be hashed and compared).
enum class TenantLabels { kOff, kName, kHash };
absl::string_view TenantLabelsName(TenantLabels labels);  // "off", "name", "hash"
absl::Status ParseTenantLabels(absl::string_view text, TenantLabels* labels);

// The outcomes of a memfd or CUDA IPC handle handed over on the shared-memory socket
// (orthoserve_shm_handovers_total{outcome}; server/shm/handover_socket.h), each series there from
// the start.
inline constexpr const char* kShmHandoverOutcomes[] = {"staged",           "refused_peer", "refused_message",
                                                       "refused_memfd",    "refused_cuda_ipc", "exhausted",
                                                       "timed_out"};
// Why a region was dropped without its owner's UnregisterRegion
// (orthoserve_shm_regions_dropped_total{cause}): its lifeline ended (the client process died or let
// go) while it was registered ("owner_gone") or still staged ("owner_gone_unclaimed").
inline constexpr const char* kShmDropCauses[] = {"owner_gone", "owner_gone_unclaimed"};


// The limits a refusal can name (orthoserve_tenant_refusals_total{limit}): a call turned away
// with RESOURCE_EXHAUSTED before it held anything — admission's limits, and unary_waiters for a
// unary call refused a place in the full waiter queue (server/rpc/unary_gate.h).
inline constexpr const char* kRefusalLimits[] = {
    "inflight_bytes", "tenant_inflight_bytes", "concurrent_streams", "tenant_concurrent_streams", "tenant_call_rate",
    "fair_share",     "unary_waiters"};

// The causes a cut can name (orthoserve_tenant_cuts_total{cause}): a call the server ended after
// admitting it, because of what its client did:
//  - not_sending: a stream whose client sent fewer than --stream-min-progress-bytes (nothing, or
//    a trickle) in --stream-progress-timeout while its next messages were awaited;
//  - not_reading: a stream whose client read too little of its results in that time;
//  - unary_request: a unary call whose request did not arrive within --stream-progress-timeout
//    of its room being reserved;
//  - pushed_out: a unary call waiting for a slot, pushed out of the full queue by a tenant under
//    its part of it.
inline constexpr const char* kCutCauses[] = {"not_sending", "not_reading", "unary_request", "pushed_out"};

class Metrics {
 public:
  // The configured limits, exported as constant orthoserve_limit_* gauges so that alerts and
  // panels can put use in proportion to them. A limit <= 0 is not exported (not configured).
  struct Limits {
    int64_t inflight_bytes = 0;         // --max-inflight-bytes: orthoserve_limit_inflight_bytes
    int64_t tenant_inflight_bytes = 0;  // --max-tenant-inflight-bytes: orthoserve_limit_tenant_inflight_bytes
    int64_t concurrent_streams = 0;     // --max-concurrent-streams: orthoserve_limit_concurrent_streams
    int64_t tenant_concurrent_streams = 0;  // --max-tenant-concurrent-streams (0: none, not exported):
                                            // orthoserve_limit_tenant_concurrent_streams
    int64_t chunk_bytes = 0;            // --chunk-bytes: orthoserve_limit_chunk_bytes
    int64_t message_bytes = 0;          // --max-message-bytes: orthoserve_limit_message_bytes
    int64_t matrix_elements = 0;        // --max-matrix-elements: orthoserve_limit_matrix_elements
    int64_t matrices_per_step = 0;      // --max-matrices-per-step: orthoserve_limit_matrices_per_step
    int64_t name_bytes = 0;             // --max-name-bytes: orthoserve_limit_name_bytes
    int64_t shape_dims = 0;             // --max-shape-dims: orthoserve_limit_shape_dims
    int64_t group_world = 0;            // --max-group-world: orthoserve_limit_group_world
    int64_t tenant_pending_steps = 0;   // --max-tenant-pending-steps (0: none, not exported):
                                        // orthoserve_limit_tenant_pending_steps
    int64_t compute_workers = 0;        // --workers: orthoserve_limit_compute_workers
    absl::Duration rendezvous_timeout;  // --rendezvous-timeout: orthoserve_limit_rendezvous_timeout_seconds
    absl::Duration collective_timeout;  // --collective-timeout: orthoserve_limit_collective_timeout_seconds
  };

  struct Options {
    std::string address;  // HOST:PORT of the /metrics HTTP endpoint; empty: no exposer.
    std::string version;  // build_info labels.
    std::string backend;
    std::string device;
    int fleet_protocol = 0;  // The protocol between fleet ranks (server/fleet/wire/fleet_codec.h).
    Limits limits;
    bool process_metrics = true;  // The process_* families (from /proc).
    TenantLabels tenant_labels = TenantLabels::kOff;
    // (label value, PEM path) of the certificates whose expiry is reported (CertificateExpiry).
    std::vector<std::pair<std::string, std::string>> certificates;
  };

  // INVALID_ARGUMENT for a malformed `address`, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const Options& options);

  // The port the exposer listens on (resolves ":0"), or 0 without an exposer.
  int port() const;
  prometheus::Registry& registry() { return *registry_; }
  // Everything a scrape serves: the registry's families, then the process_* ones.
  std::vector<prometheus::MetricFamily> Collect() const;

  void RequestDone(absl::string_view method, absl::string_view code, absl::Duration duration);
  void MatrixDone(absl::string_view method, absl::string_view algorithm, absl::string_view dtype,
                  absl::string_view code);
  void StageTime(Stage stage, absl::Duration duration);
  // One call of the fleet's collective; op: all_to_allv, all_gatherv, all_reduce, broadcast,
  // barrier (server/collective/timed_collective.h).
  void CollectiveTime(absl::string_view op, absl::Duration duration);
  void BytesIn(absl::string_view method, double bytes);
  void BytesOut(absl::string_view method, double bytes);
  void Flops(double flops);
  void RendezvousTimeout();
  // A group step failed on this rank's trainers; reason: one of kStepAbortReasons.
  void StepAborted(absl::string_view reason);
  // A request refused to keep results the caller's own, or metadata bounded; cause: one of
  // kIntegrityRefusalCauses.
  void IntegrityRefused(absl::string_view cause);
  // A step arrived with attempt > 0 (a client retried it).
  void StepRetried(absl::string_view method);
  // A lone client's matrix computed `where`: "here", "peer" (forwarded to another member), or
  // "fallback" (forwarded, the member could not compute it, computed here).
  void LoneMatrix(absl::string_view where);
  // The coordinator started a generation; reason: joined, restarted, left, lost, collective_failed,
  // released (a rank's quarantine ended).
  void Reformation(absl::string_view reason);
  // The coordinator left fleet rank `rank` out of the next generation for a while: it kept
  // failing to join the collective (membership.h, "Quarantine").
  void Quarantined(int rank);
  // The fleet has ranks 0..world-1: their quarantine counters exist (at 0) from the start.
  void FleetRanks(int world);
  // Time this rank saw the fleet below its configured size (or itself outside it).
  void Degraded(absl::Duration duration);

  // Shared-memory regions (docs/shared_memory.md): registered regions and their bytes, all
  // tenants together, of `memory` "host" (memfds) or "cuda" (CUDA IPC)
  // (orthoserve_shm_regions{memory}, orthoserve_shm_region_bytes{memory}), and one memfd or CUDA
  // IPC handle handed over on the socket, by outcome (one of kShmHandoverOutcomes).
  void ShmRegions(absl::string_view memory, int64_t regions, int64_t bytes);
  void ShmHandover(absl::string_view outcome);
  // A region dropped because its owner went (`cause`: one of kShmDropCauses).
  void ShmRegionDropped(absl::string_view cause);
  // A matrix whose input or result (`direction`: "input", "result") is a region's slice, read or
  // written in place (orthoserve_shm_matrices_total{direction}).
  void ShmMatrix(absl::string_view direction);
  // A FenceCall answered with `code` (absl::StatusCodeToString) after waiting `waited` for the
  // call's slices (orthoserve_shm_fences_total{code}, orthoserve_shm_fence_wait_seconds).
  void ShmFence(absl::string_view code, absl::Duration waited);

  prometheus::Gauge& inflight_requests() { return *inflight_requests_; }
  prometheus::Gauge& inflight_bytes() { return *inflight_bytes_; }
  prometheus::Gauge& inflight_streams() { return *inflight_streams_; }
  // The `tenant` label value of `tenant` under the configured TenantLabels.
  std::string TenantLabel(absl::string_view tenant) const;
  // Per-tenant families: bytes held in flight (`bytes` of `tenant`; `largest` over all tenants,
  // reported instead when labels are off), compute-queue wait and compute time of each matrix,
  // matrix bytes received ("in") and sent ("out"), and admission refusals by limit (one of
  // kRefusalLimits).
  void TenantInflightBytes(absl::string_view tenant, int64_t bytes, int64_t largest);
  void TenantQueueWait(absl::string_view tenant, absl::Duration wait);
  void TenantCompute(absl::string_view tenant, absl::Duration compute);
  void TenantBytes(absl::string_view tenant, absl::string_view direction, double bytes);
  void TenantRefused(absl::string_view tenant, absl::string_view limit);
  // A call of `tenant` cut for `cause` (one of kCutCauses).
  void TenantCut(absl::string_view tenant, absl::string_view cause);
  prometheus::Gauge& queue_depth() { return *queue_depth_; }
  prometheus::Gauge& fleet_size() { return *fleet_size_; }
  prometheus::Gauge& fleet_members_ready() { return *fleet_members_ready_; }
  prometheus::Gauge& fleet_ready() { return *fleet_ready_; }
  prometheus::Gauge& fleet_generation() { return *fleet_generation_; }
  // Elected coordinator (etcd): 1 while this rank coordinates; the term it follows; when etcd
  // stopped answering it (Unix seconds; 0 while it answers).
  prometheus::Gauge& fleet_coordinator() { return *fleet_coordinator_; }
  prometheus::Gauge& fleet_coordinator_term() { return *fleet_coordinator_term_; }
  prometheus::Gauge& fleet_etcd_unreachable_since() { return *fleet_etcd_unreachable_since_; }
  prometheus::Gauge& device_memory(absl::string_view kind);
  // The backend's copies so far in `direction` ("h2d", "d2h" or "d2d"; Backend::Copies, totals
  // since it started): the counters advance by what is new since the last call.
  void DeviceCopies(absl::string_view direction, int64_t bytes, int64_t calls);

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ProcessCollector> process_;  // Null without process metrics.
  std::unique_ptr<CertificateExpiry> certificates_;
  std::unique_ptr<HttpExposer> exposer_;

  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* matrices_ = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* stage_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* collective_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_in_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_out_ = nullptr;
  prometheus::Family<prometheus::Counter>* steps_aborted_ = nullptr;
  prometheus::Family<prometheus::Counter>* integrity_refusals_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_memory_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_copy_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_copies_ = nullptr;
  absl::Mutex copies_mu_;
  // Per direction: bytes and calls counted so far.
  std::map<std::string, std::pair<int64_t, int64_t>> copies_seen_ ABSL_GUARDED_BY(copies_mu_);
  prometheus::Family<prometheus::Counter>* steps_retried_ = nullptr;
  prometheus::Family<prometheus::Counter>* lone_matrices_ = nullptr;
  prometheus::Family<prometheus::Counter>* reformations_ = nullptr;
  prometheus::Family<prometheus::Counter>* quarantines_ = nullptr;
  prometheus::Counter* degraded_seconds_ = nullptr;
  prometheus::Gauge* fleet_generation_ = nullptr;
  prometheus::Counter* flops_ = nullptr;
  prometheus::Family<prometheus::Gauge>* shm_regions_ = nullptr;
  prometheus::Family<prometheus::Gauge>* shm_region_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* shm_handovers_ = nullptr;
  prometheus::Family<prometheus::Counter>* shm_regions_dropped_ = nullptr;
  prometheus::Family<prometheus::Counter>* shm_matrices_ = nullptr;
  prometheus::Family<prometheus::Counter>* shm_fences_ = nullptr;
  prometheus::Histogram* shm_fence_wait_ = nullptr;
  prometheus::Counter* rendezvous_timeouts_ = nullptr;
  prometheus::Gauge* inflight_requests_ = nullptr;
  prometheus::Gauge* inflight_bytes_ = nullptr;
  prometheus::Gauge* inflight_streams_ = nullptr;
  TenantLabels tenant_labels_ = TenantLabels::kOff;
  prometheus::Family<prometheus::Gauge>* tenant_inflight_bytes_ = nullptr;
  prometheus::Family<prometheus::Histogram>* tenant_queue_wait_ = nullptr;
  prometheus::Family<prometheus::Counter>* tenant_compute_ = nullptr;
  prometheus::Family<prometheus::Counter>* tenant_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* tenant_refusals_ = nullptr;
  prometheus::Family<prometheus::Counter>* tenant_cuts_ = nullptr;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* fleet_size_ = nullptr;
  prometheus::Gauge* fleet_coordinator_ = nullptr;
  prometheus::Gauge* fleet_coordinator_term_ = nullptr;
  prometheus::Gauge* fleet_etcd_unreachable_since_ = nullptr;
  prometheus::Gauge* fleet_members_ready_ = nullptr;
  prometheus::Gauge* fleet_ready_ = nullptr;
};

}  // namespace orthoserve
