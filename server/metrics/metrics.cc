// Implementation of server/metrics/metrics.h.
#include "server/metrics/metrics.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"

namespace orthoserve {
namespace {

// Request and stage latencies: 100 µs to 5 min.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    120,  300};

}  // namespace

absl::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kReceive: return "receive";
    case Stage::kQueue: return "queue";
    case Stage::kRendezvous: return "rendezvous";
    case Stage::kCollective: return "collective";
    case Stage::kCompute: return "compute";
    case Stage::kSend: return "send";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const Options& options) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& r = *m->registry_;

  prometheus::BuildGauge()
      .Name("orthoserve_build_info")
      .Help("Build, backend and fleet protocol of this server rank; always 1.")
      .Register(r)
      .Add({{"version", options.version},
            {"backend", options.backend},
            {"device", options.device},
            {"fleet_protocol", std::to_string(options.fleet_protocol)}})
      .Set(1);
  m->requests_ = &prometheus::BuildCounter()
                      .Name("orthoserve_requests_total")
                      .Help("RPCs finished, by method and gRPC status code.")
                      .Register(r);
  m->matrices_ = &prometheus::BuildCounter()
                      .Name("orthoserve_matrices_total")
                      .Help("Matrices finished, by method, algorithm, input dtype and status code.")
                      .Register(r);
  m->request_duration_ = &prometheus::BuildHistogram()
                              .Name("orthoserve_request_duration_seconds")
                              .Help("Wall time of an RPC from its start to its status.")
                              .Register(r);
  m->stage_duration_ = &prometheus::BuildHistogram()
                            .Name("orthoserve_stage_duration_seconds")
                            .Help("Time spent per stage: receive, queue, rendezvous, collective, compute, send.")
                            .Register(r);
  m->collective_duration_ = &prometheus::BuildHistogram()
                                 .Name("orthoserve_collective_duration_seconds")
                                 .Help("Duration of each call of the fleet's collective (Gloo, NCCL, or local on a "
                                       "one-rank fleet), failed calls included, by op: all_to_allv, all_gatherv, "
                                       "all_reduce, broadcast, barrier.")
                                 .Register(r);
  m->bytes_in_ = &prometheus::BuildCounter()
                      .Name("orthoserve_received_bytes_total")
                      .Help("Matrix payload bytes received from clients.")
                      .Register(r);
  m->bytes_out_ = &prometheus::BuildCounter()
                       .Name("orthoserve_sent_bytes_total")
                       .Help("Matrix payload bytes sent to clients.")
                       .Register(r);
  m->steps_aborted_ = &prometheus::BuildCounter()
                           .Name("orthoserve_steps_aborted_total")
                           .Help("Group steps that failed on this rank's trainers, by reason: timeout (not every trainer "
                                 "rank arrived within the rendezvous timeout), cancelled (a trainer rank's client "
                                 "cancelled its call or its deadline passed), aborted (a trainer rank's call failed "
                                 "otherwise, or it retried a step its group had already run past), invalid (the trainer "
                                 "ranks' requests disagree), collective (the batch failed in the fleet's collective), "
                                 "fleet_change (planned for a fleet generation that ended before it ran), "
                                 "run_mismatch (another run of the job was gathering the same step), digest_mismatch (a "
                                 "retry whose blocks differ from the attempt that ran), limit (over a metadata limit: "
                                 "pending steps of the tenant, or a plan too large for the fleet's log).")
                           .Register(r);
  m->integrity_refusals_ = &prometheus::BuildCounter()
                                .Name("orthoserve_integrity_refusals_total")
                                .Help("Requests refused so that every answer stays its caller's own, or metadata "
                                      "bounded, by cause: run_mismatch (a group report of one run for a step another "
                                      "run's ranks were gathering; counted by the coordinator), digest_mismatch (a "
                                      "retry whose blocks differ from the kept attempt; coordinator), not_a_member (a "
                                      "fleet-port call from a peer that is not a fleet member, or not the rank it "
                                      "claims), limit (a request over a metadata limit), etcd_value (a value read "
                                      "from etcd that no rank of this fleet would write: a leader or liveness key "
                                      "refused).")
                                .Register(r);
  for (const char* cause : kIntegrityRefusalCauses) m->integrity_refusals_->Add({{"cause", cause}});
  m->device_memory_ = &prometheus::BuildGauge()
                           .Name("orthoserve_device_memory_bytes")
                           .Help("Device memory of the backend: used and budget.")
                           .Register(r);
  m->device_copy_bytes_ = &prometheus::BuildCounter()
                               .Name("orthoserve_device_copy_bytes_total")
                               .Help("Bytes the backend copied between host and device memory, by direction "
                                     "(h2d, d2h); 0 on the cpu backend.")
                               .Register(r);
  m->device_copies_ = &prometheus::BuildCounter()
                           .Name("orthoserve_device_copies_total")
                           .Help("Copies (copy API calls) the backend made between host and device memory, by "
                                 "direction (h2d, d2h); 0 on the cpu backend.")
                           .Register(r);
  m->flops_ = &prometheus::BuildCounter()
                   .Name("orthoserve_newton_schulz_flops_total")
                   .Help("Floating-point operations of Newton-Schulz computed on this rank.")
                   .Register(r)
                   .Add({});
  m->shm_regions_ = &prometheus::BuildGauge()
                         .Name("orthoserve_shm_regions")
                         .Help("Shared-memory regions registered on this rank, all tenants together, by memory: "
                               "host (memfds) or cuda (GPU memory by CUDA IPC handle).")
                         .Register(r);
  m->shm_region_bytes_ = &prometheus::BuildGauge()
                              .Name("orthoserve_shm_region_bytes")
                              .Help("Bytes of the shared-memory regions registered on this rank, by memory (host, "
                                    "cuda).")
                              .Register(r);
  for (const char* memory : {"host", "cuda"}) {
    m->shm_regions_->Add({{"memory", memory}});
    m->shm_region_bytes_->Add({{"memory", memory}});
  }
  m->shm_handovers_ = &prometheus::BuildCounter()
                           .Name("orthoserve_shm_handovers_total")
                           .Help("Memfds and CUDA IPC handles handed over on the shared-memory socket, by "
                                 "outcome: staged (waiting for RegisterRegion), refused_peer (uid not accepted), "
                                 "refused_message, refused_memfd (not a sealed, read-write memfd of an accepted "
                                 "size), refused_cuda_ipc (not opened: a cpu backend, another GPU, a stale handle, "
                                 "out of its allocation), exhausted (too many waiting, too many connections "
                                 "held, or too many being read), timed_out (no whole message within the socket's "
                                 "per-connection deadline).")
                           .Register(r);
  m->shm_regions_dropped_ = &prometheus::BuildCounter()
                                 .Name("orthoserve_shm_regions_dropped_total")
                                 .Help("Shared-memory regions dropped without an UnregisterRegion because the "
                                       "connection their client handed them over on ended (the process died or "
                                       "closed it), by cause: owner_gone (registered), owner_gone_unclaimed "
                                       "(handed over, not yet registered).")
                                 .Register(r);
  m->shm_matrices_ = &prometheus::BuildCounter()
                          .Name("orthoserve_shm_matrices_total")
                          .Help("Matrices whose input or result (direction: input, result) was a shared-memory "
                                "region's slice, read or written in place.")
                          .Register(r);
  m->shm_fences_ = &prometheus::BuildCounter()
                        .Name("orthoserve_shm_fences_total")
                        .Help("FenceCall answers by code: a client waited until the server held none of a failed "
                              "call's region slices (OK), or the wait ran out (DEADLINE_EXCEEDED).")
                        .Register(r);
  m->shm_fence_wait_ = &prometheus::BuildHistogram()
                            .Name("orthoserve_shm_fence_wait_seconds")
                            .Help("How long a FenceCall waited for its call's region slices to be let go of.")
                            .Register(r)
                            .Add({}, kLatencyBuckets);
  m->rendezvous_timeouts_ = &prometheus::BuildCounter()
                                 .Name("orthoserve_rendezvous_timeouts_total")
                                 .Help("Group steps whose trainer ranks did not all arrive in time.")
                                 .Register(r)
                                 .Add({});
  m->steps_retried_ = &prometheus::BuildCounter()
                           .Name("orthoserve_steps_retried_total")
                           .Help("Steps a client sent again after a retryable failure (StepHeader.attempt > 0).")
                           .Register(r);
  m->lone_matrices_ = &prometheus::BuildCounter()
                           .Name("orthoserve_lone_matrices_total")
                           .Help("Lone clients' matrices received here, by where they were computed: here, peer "
                                 "(another member of the fleet), fallback (the member could not; computed here).")
                           .Register(r);
  m->reformations_ = &prometheus::BuildCounter()
                          .Name("orthoserve_fleet_reformations_total")
                          .Help("Fleet generations started by this rank's coordinator, by reason: joined, restarted, "
                                "left, lost, collective_failed, released (a rank's quarantine ended).")
                          .Register(r);
  m->quarantines_ = &prometheus::BuildCounter()
                         .Name("orthoserve_fleet_quarantines_total")
                         .Help("Fleet ranks this rank's coordinator left out of a generation for a while because they "
                               "kept failing to join its collective, by rank.")
                         .Register(r);
  m->degraded_seconds_ = &prometheus::BuildCounter()
                              .Name("orthoserve_fleet_degraded_seconds_total")
                              .Help("Seconds this rank saw fewer fleet members than --world (or was not one itself).")
                              .Register(r)
                              .Add({});
  auto gauge = [&r](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  m->inflight_requests_ = gauge("orthoserve_inflight_requests", "RPCs in progress.");
  m->inflight_bytes_ = gauge("orthoserve_inflight_bytes",
                             "Matrix bytes held for requests in progress (admitted against --max-inflight-bytes).");
  m->inflight_streams_ = gauge("orthoserve_inflight_streams",
                               "OrthogonalizeStream calls in progress (admitted against --max-concurrent-streams).");
  // Per tenant; the `tenant` label follows --tenant-labels (TenantLabels: "all" unless asked).
  m->tenant_labels_ = options.tenant_labels;
  m->tenant_inflight_bytes_ = &prometheus::BuildGauge()
                                   .Name("orthoserve_tenant_inflight_bytes")
                                   .Help("Matrix bytes held for a tenant's requests in progress (admitted against "
                                         "--max-tenant-inflight-bytes), by tenant (--tenant-labels; with labels off, "
                                         "tenant=\"all\" holds the largest tenant's figure).")
                                   .Register(r);
  m->tenant_queue_wait_ = &prometheus::BuildHistogram()
                               .Name("orthoserve_tenant_queue_wait_seconds")
                               .Help("Time a lone client's matrix waited in the compute queue, by tenant "
                                     "(--tenant-labels).")
                               .Register(r);
  m->tenant_compute_ = &prometheus::BuildCounter()
                            .Name("orthoserve_tenant_compute_seconds_total")
                            .Help("Compute time of lone clients' matrices, by tenant (--tenant-labels).")
                            .Register(r);
  m->tenant_bytes_ = &prometheus::BuildCounter()
                          .Name("orthoserve_tenant_bytes_total")
                          .Help("Matrix bytes received (direction=\"in\") and sent (\"out\"), by tenant "
                                "(--tenant-labels).")
                          .Register(r);
  m->tenant_refusals_ = &prometheus::BuildCounter()
                             .Name("orthoserve_tenant_refusals_total")
                             .Help("Calls refused RESOURCE_EXHAUSTED before they held anything, by tenant "
                                   "(--tenant-labels) and limit: inflight_bytes, tenant_inflight_bytes, "
                                   "concurrent_streams, tenant_concurrent_streams, tenant_call_rate, fair_share (a "
                                   "stream slot kept for other tenants' fair shares), unary_waiters (the unary "
                                   "waiter queue is full).")
                             .Register(r);
  m->tenant_cuts_ = &prometheus::BuildCounter()
                         .Name("orthoserve_tenant_cuts_total")
                         .Help("Calls the server ended after admitting them, by tenant (--tenant-labels) and cause: "
                               "not_sending, not_reading (a stream that moved fewer than --stream-min-progress-bytes "
                               "in --stream-progress-timeout), unary_request (a unary request that did not arrive "
                               "within --stream-progress-timeout), pushed_out (a waiting unary call pushed out of the "
                               "full queue by another tenant).")
                         .Register(r);
  if (options.tenant_labels == TenantLabels::kOff) {  // One "all" series per limit and cause, there from the start.
    for (const char* limit : kRefusalLimits) m->tenant_refusals_->Add({{"tenant", "all"}, {"limit", limit}});
    for (const char* cause : kCutCauses) m->tenant_cuts_->Add({{"tenant", "all"}, {"cause", cause}});
  }
  // The configured limits, constant for the process.
  const Limits& l = options.limits;
  auto limit = [&gauge](const char* name, const char* help, double value) {
    if (value > 0) gauge(name, help)->Set(value);
  };
  limit("orthoserve_limit_inflight_bytes", "--max-inflight-bytes: matrix bytes the rank holds in flight at most.",
        static_cast<double>(l.inflight_bytes));
  limit("orthoserve_limit_tenant_inflight_bytes",
        "--max-tenant-inflight-bytes: matrix bytes one tenant holds in flight at most.",
        static_cast<double>(l.tenant_inflight_bytes));
  limit("orthoserve_limit_concurrent_streams", "--max-concurrent-streams: OrthogonalizeStream calls at once at most.",
        static_cast<double>(l.concurrent_streams));
  limit("orthoserve_limit_tenant_concurrent_streams",
        "--max-tenant-concurrent-streams: OrthogonalizeStream calls of one tenant at once at most (absent: no limit).",
        static_cast<double>(l.tenant_concurrent_streams));
  limit("orthoserve_limit_chunk_bytes", "--chunk-bytes: largest DataChunk accepted and sent.",
        static_cast<double>(l.chunk_bytes));
  limit("orthoserve_limit_message_bytes", "--max-message-bytes: largest gRPC message sent or received.",
        static_cast<double>(l.message_bytes));
  limit("orthoserve_limit_matrix_elements", "--max-matrix-elements: largest matrix accepted, in elements.",
        static_cast<double>(l.matrix_elements));
  limit("orthoserve_limit_matrices_per_step", "--max-matrices-per-step: matrices in one step or unary call at most.",
        static_cast<double>(l.matrices_per_step));
  limit("orthoserve_limit_name_bytes",
        "--max-name-bytes: longest matrix name, job, group or run id accepted, in bytes.",
        static_cast<double>(l.name_bytes));
  limit("orthoserve_limit_shape_dims", "--max-shape-dims: dims of one matrix shape at most.",
        static_cast<double>(l.shape_dims));
  limit("orthoserve_limit_group_world", "--max-group-world: trainer ranks of one group step at most.",
        static_cast<double>(l.group_world));
  limit("orthoserve_limit_tenant_pending_steps",
        "--max-tenant-pending-steps: group steps of one tenant pending on the fleet at once (absent: no limit).",
        static_cast<double>(l.tenant_pending_steps));
  limit("orthoserve_limit_compute_workers", "--workers: concurrent compute jobs for lone clients.",
        static_cast<double>(l.compute_workers));
  limit("orthoserve_limit_rendezvous_timeout_seconds",
        "--rendezvous-timeout: how long a group step waits for all its trainer ranks.",
        absl::ToDoubleSeconds(l.rendezvous_timeout));
  limit("orthoserve_limit_collective_timeout_seconds", "--collective-timeout: bound of each fleet collective call.",
        absl::ToDoubleSeconds(l.collective_timeout));
  m->queue_depth_ = gauge("orthoserve_queue_depth", "Matrices and batches waiting for compute.");
  m->fleet_size_ = gauge("orthoserve_fleet_size", "Configured number of fleet ranks (S).");
  m->fleet_members_ready_ = gauge("orthoserve_fleet_members_ready",
                                  "Members of the fleet generation this rank knows (ranks serving group steps).");
  m->fleet_ready_ = gauge("orthoserve_fleet_ready",
                          "1 when this rank is a member of a formed fleet generation (it serves group steps).");
  m->fleet_generation_ = gauge("orthoserve_fleet_generation", "The fleet membership generation this rank is in (0: none).");
  m->fleet_coordinator_ = gauge("orthoserve_fleet_coordinator",
                                "1 while this rank is the fleet's elected coordinator (--membership etcd://).");
  m->fleet_coordinator_term_ = gauge("orthoserve_fleet_coordinator_term",
                                     "The etcd leadership term of the coordinator this rank follows (0: static or none).");
  m->fleet_etcd_unreachable_since_ =
      gauge("orthoserve_fleet_etcd_unreachable_since_timestamp_seconds",
            "When etcd stopped answering this rank (Unix seconds; 0 while it answers or without etcd).");
  // Series that exist from the start, so dashboards and alerts see zeros rather than nothing.
  for (Stage stage : {Stage::kReceive, Stage::kQueue, Stage::kRendezvous, Stage::kCollective, Stage::kCompute,
                      Stage::kSend}) {
    m->stage_duration_->Add({{"stage", std::string(StageName(stage))}}, kLatencyBuckets);
  }
  for (const char* method : {"Orthogonalize", "OrthogonalizeStream"}) {
    m->request_duration_->Add({{"method", method}}, kLatencyBuckets);
    m->requests_->Add({{"method", method}, {"code", "OK"}});
    m->bytes_in_->Add({{"method", method}});
    m->bytes_out_->Add({{"method", method}});
  }
  for (const char* op : {"all_to_allv", "all_gatherv", "all_reduce", "broadcast", "barrier"}) {
    m->collective_duration_->Add({{"op", op}}, kLatencyBuckets);
  }
  for (const char* reason : kStepAbortReasons) m->steps_aborted_->Add({{"reason", reason}});
  for (const char* reason : {"joined", "restarted", "left", "lost", "collective_failed", "released"}) {
    m->reformations_->Add({{"reason", reason}});
  }
  for (const char* method : {"Orthogonalize", "OrthogonalizeStream"}) m->steps_retried_->Add({{"method", method}});
  for (const char* where : {"here", "peer", "fallback"}) m->lone_matrices_->Add({{"where", where}});
  for (const char* outcome : kShmHandoverOutcomes) m->shm_handovers_->Add({{"outcome", outcome}});
  for (const char* cause : kShmDropCauses) m->shm_regions_dropped_->Add({{"cause", cause}});
  for (const char* direction : {"input", "result"}) m->shm_matrices_->Add({{"direction", direction}});
  m->shm_fences_->Add({{"code", "OK"}});
  m->device_memory_->Add({{"kind", "used"}});
  m->device_memory_->Add({{"kind", "budget"}});
  for (const char* direction : {"h2d", "d2h", "d2d"}) {
    m->device_copy_bytes_->Add({{"direction", direction}});
    m->device_copies_->Add({{"direction", direction}});
  }

  if (options.process_metrics) m->process_ = std::make_unique<ProcessCollector>();
  m->certificates_ = std::make_unique<CertificateExpiry>(options.certificates);

  if (!options.address.empty()) {
    const Metrics* raw = m.get();
    auto exposer = HttpExposer::Create(options.address, [raw] { return raw->Collect(); });
    if (!exposer.ok()) return exposer.status();
    m->exposer_ = std::move(*exposer);
  }
  return m;
}

int Metrics::port() const { return exposer_ == nullptr ? 0 : exposer_->port(); }

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  if (process_ != nullptr) {
    std::vector<prometheus::MetricFamily> process = process_->Collect();
    families.insert(families.end(), std::make_move_iterator(process.begin()), std::make_move_iterator(process.end()));
  }
  std::vector<prometheus::MetricFamily> certificates = certificates_->Collect();
  families.insert(families.end(), std::make_move_iterator(certificates.begin()),
                  std::make_move_iterator(certificates.end()));
  return families;
}

void Metrics::RequestDone(absl::string_view method, absl::string_view code, absl::Duration duration) {
  requests_->Add({{"method", std::string(method)}, {"code", std::string(code)}}).Increment();
  request_duration_->Add({{"method", std::string(method)}}, kLatencyBuckets).Observe(absl::ToDoubleSeconds(duration));
}

void Metrics::MatrixDone(absl::string_view method, absl::string_view algorithm, absl::string_view dtype,
                         absl::string_view code) {
  matrices_
      ->Add({{"method", std::string(method)},
             {"algorithm", std::string(algorithm)},
             {"dtype", std::string(dtype)},
             {"code", std::string(code)}})
      .Increment();
}

void Metrics::StageTime(Stage stage, absl::Duration duration) {
  stage_duration_->Add({{"stage", std::string(StageName(stage))}}, kLatencyBuckets)
      .Observe(absl::ToDoubleSeconds(duration));
}

void Metrics::CollectiveTime(absl::string_view op, absl::Duration duration) {
  collective_duration_->Add({{"op", std::string(op)}}, kLatencyBuckets).Observe(absl::ToDoubleSeconds(duration));
}

void Metrics::BytesIn(absl::string_view method, double bytes) {
  bytes_in_->Add({{"method", std::string(method)}}).Increment(bytes);
}

void Metrics::BytesOut(absl::string_view method, double bytes) {
  bytes_out_->Add({{"method", std::string(method)}}).Increment(bytes);
}

void Metrics::Flops(double flops) { flops_->Increment(flops); }
void Metrics::ShmRegions(absl::string_view memory, int64_t regions, int64_t bytes) {
  shm_regions_->Add({{"memory", std::string(memory)}}).Set(static_cast<double>(regions));
  shm_region_bytes_->Add({{"memory", std::string(memory)}}).Set(static_cast<double>(bytes));
}

void Metrics::ShmHandover(absl::string_view outcome) {
  shm_handovers_->Add({{"outcome", std::string(outcome)}}).Increment();
}

void Metrics::ShmRegionDropped(absl::string_view cause) {
  shm_regions_dropped_->Add({{"cause", std::string(cause)}}).Increment();
}

void Metrics::ShmMatrix(absl::string_view direction) {
  shm_matrices_->Add({{"direction", std::string(direction)}}).Increment();
}

void Metrics::ShmFence(absl::string_view code, absl::Duration waited) {
  shm_fences_->Add({{"code", std::string(code)}}).Increment();
  shm_fence_wait_->Observe(absl::ToDoubleSeconds(waited));
}

void Metrics::RendezvousTimeout() { rendezvous_timeouts_->Increment(); }
void Metrics::StepAborted(absl::string_view reason) {
  steps_aborted_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::LoneMatrix(absl::string_view where) { lone_matrices_->Add({{"where", std::string(where)}}).Increment(); }

void Metrics::StepRetried(absl::string_view method) {
  steps_retried_->Add({{"method", std::string(method)}}).Increment();
}
void Metrics::Quarantined(int rank) { quarantines_->Add({{"rank", std::to_string(rank)}}).Increment(); }

void Metrics::FleetRanks(int world) {
  for (int r = 0; r < world; ++r) quarantines_->Add({{"rank", std::to_string(r)}});
}

void Metrics::Reformation(absl::string_view reason) { reformations_->Add({{"reason", std::string(reason)}}).Increment(); }
void Metrics::Degraded(absl::Duration duration) { degraded_seconds_->Increment(absl::ToDoubleSeconds(duration)); }

absl::string_view TenantLabelsName(TenantLabels labels) {
  switch (labels) {
    case TenantLabels::kOff: return "off";
    case TenantLabels::kName: return "name";
    case TenantLabels::kHash: return "hash";
  }
  return "off";
}

absl::Status ParseTenantLabels(absl::string_view text, TenantLabels* labels) {
  for (TenantLabels l : {TenantLabels::kOff, TenantLabels::kName, TenantLabels::kHash}) {
    if (text == TenantLabelsName(l)) {
      *labels = l;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not off, name or hash"));
}

std::string Metrics::TenantLabel(absl::string_view tenant) const {
  switch (tenant_labels_) {
    case TenantLabels::kOff: return "all";
    case TenantLabels::kName: return std::string(tenant);
    case TenantLabels::kHash: {
      uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits.
      for (unsigned char c : tenant) h = (h ^ c) * 1099511628211ull;
      return absl::StrCat("t-", absl::Hex(h >> 16, absl::kZeroPad12));
    }
  }
  return "all";
}

void Metrics::TenantInflightBytes(absl::string_view tenant, int64_t bytes, int64_t largest) {
  const bool off = tenant_labels_ == TenantLabels::kOff;
  tenant_inflight_bytes_->Add({{"tenant", TenantLabel(tenant)}}).Set(static_cast<double>(off ? largest : bytes));
}

void Metrics::TenantQueueWait(absl::string_view tenant, absl::Duration wait) {
  tenant_queue_wait_->Add({{"tenant", TenantLabel(tenant)}}, kLatencyBuckets).Observe(absl::ToDoubleSeconds(wait));
}

void Metrics::TenantCompute(absl::string_view tenant, absl::Duration compute) {
  tenant_compute_->Add({{"tenant", TenantLabel(tenant)}}).Increment(absl::ToDoubleSeconds(compute));
}

void Metrics::TenantBytes(absl::string_view tenant, absl::string_view direction, double bytes) {
  tenant_bytes_->Add({{"tenant", TenantLabel(tenant)}, {"direction", std::string(direction)}}).Increment(bytes);
}

void Metrics::TenantRefused(absl::string_view tenant, absl::string_view limit) {
  tenant_refusals_->Add({{"tenant", TenantLabel(tenant)}, {"limit", std::string(limit)}}).Increment();
}

void Metrics::TenantCut(absl::string_view tenant, absl::string_view cause) {
  tenant_cuts_->Add({{"tenant", TenantLabel(tenant)}, {"cause", std::string(cause)}}).Increment();
}

void Metrics::IntegrityRefused(absl::string_view cause) {
  integrity_refusals_->Add({{"cause", std::string(cause)}}).Increment();
}

void Metrics::DeviceCopies(absl::string_view direction, int64_t bytes, int64_t calls) {
  absl::MutexLock lock(&copies_mu_);
  const std::string label(direction);
  std::pair<int64_t, int64_t>& seen = copies_seen_[label];
  if (bytes > seen.first) device_copy_bytes_->Add({{"direction", label}}).Increment(static_cast<double>(bytes - seen.first));
  if (calls > seen.second) device_copies_->Add({{"direction", label}}).Increment(static_cast<double>(calls - seen.second));
  seen = {std::max(seen.first, bytes), std::max(seen.second, calls)};
}

prometheus::Gauge& Metrics::device_memory(absl::string_view kind) {
  return device_memory_->Add({{"kind", std::string(kind)}});
}

}  // namespace orthoserve
