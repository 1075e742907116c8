// Implementation of server/fleet/wire/fleet.h.
#include "server/fleet/wire/fleet.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "server/collective/gloo/gloo_collective.h"
#include "server/collective/in_memory_store.h"
#include "server/collective/local_collective.h"
#include "server/collective/timed_collective.h"
#if ORTHOSERVE_WITH_CUDA
#include "server/collective/nccl/nccl_collective.h"
#endif
#include "server/fleet/wire/fleet_client.h"
#include "server/fleet/wire/fleet_codec.h"
#include "server/fleet/wire/fleet_service.h"
#include "server/fleet/logic/address.h"

namespace orthoserve {
namespace {

bool IsWildcard(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::"; }

// A one-rank fleet is usable as soon as Create returns.
constexpr absl::Duration kLocalFormation = absl::Seconds(10);

// The bound on joining one generation's collective. Members of a generation are live processes,
// so joining its group is quick; a member that died meanwhile is dropped by the coordinator
// within the peer timeout.
absl::Duration FormationTimeout(absl::Duration peer_timeout) { return std::max(absl::Seconds(10), 2 * peer_timeout); }

}  // namespace

absl::StatusOr<std::unique_ptr<Fleet>> Fleet::Create(const Options& options) {
  if (options.world < 1) return absl::InvalidArgumentError(absl::StrCat("--world = ", options.world, " must be >= 1"));
  if (options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank = ", options.rank, " is out of range for --world = ", options.world));
  }
  if (options.backend == nullptr) return absl::InvalidArgumentError("Fleet needs a backend");
  if (options.world > 1 && options.collective != "gloo" && options.collective != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("collective \"", options.collective, "\" is not one of gloo, nccl"));
  }
  if (options.world > 1 && options.coordinator.empty() && !options.election.enabled) {
    return absl::InvalidArgumentError(
        "--coordinator is required when --world > 1: give rank 0's fleet address (its --fleet-listen)");
  }
  if ((options.world > 1 || options.election.enabled) && options.fleet_listen.empty()) {
    return absl::InvalidArgumentError(
        "--fleet-listen is required when --world > 1 or with --membership etcd:// (this rank's internal address)");
  }
  std::unique_ptr<Fleet> fleet(new Fleet(options));
  if (options.tls.enabled()) {
    ASSIGN_OR_RETURN(fleet->tls_, FleetTls::Load(options.tls, options.world));
  } else if (options.world > 1) {
    LOG_WARNING("fleet") << "the fleet port " << options.fleet_listen
                         << " is plaintext and trusts anything that reaches it (joins as any rank, aborts, the "
                            "rendezvous store, peer compute): give --fleet-tls-cert, --fleet-tls-key and "
                            "--fleet-tls-ca (mutual TLS between members; docs/operations.md, \"Security\"), or keep "
                            "the port behind a network policy that admits the fleet's own ranks only";
  }
  fleet->access_ = std::make_unique<FleetAccess>(fleet->tls_, options.metrics);
  Metrics* metrics = options.metrics;
  if (metrics != nullptr) {
    metrics->fleet_size().Set(options.world);
    // The coordinator counts quarantines: rank 0's, or any elected one's.
    if (options.rank == 0 || options.election.enabled) metrics->FleetRanks(options.world);
  }

  if (options.election.enabled) {
    fleet->link_ = std::make_unique<LeaderLink>(fleet->tls_.get());
    fleet->store_ = fleet->link_->store();
  } else if (options.rank == 0) {
    ASSIGN_OR_RETURN(fleet->coordinator_, Coordinator::Create(fleet->CoordinatorOptions(/*epoch=*/0, /*home_rank=*/0)));
    fleet->served_store_ = std::make_shared<InMemoryStore>();
    fleet->store_ = fleet->served_store_;
    fleet->log_ = std::make_unique<LocalLogSource>(fleet->coordinator_.get());
  } else {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     MakeFleetChannel(options.coordinator, fleet->tls_.get(), /*rank=*/0));
    fleet->store_ = std::make_shared<GrpcStore>(channel);
    fleet->log_ = std::make_unique<RemoteLogSource>(channel);
  }
  RETURN_IF_ERROR(fleet->ServeFleetPort());

  Executor::Options e;
  e.self = Member{options.rank, options.advertise_address, RandomNonZeroId(),
                  fleet->peer_service_ != nullptr ? fleet->fleet_port_ : 0};
  fleet->peers_ = std::make_unique<PeerClient>(options.collective_timeout, fleet->tls_.get());
  e.backend = options.backend;
  e.log = fleet->link_ != nullptr ? &fleet->link_->log() : fleet->log_.get();
  e.metrics = metrics;
  e.join_collective = fleet->MakeCollectiveFactory();
  e.execute.collective_timeout = options.collective_timeout;
  e.peer_timeout = options.peer_timeout;
  // The coordinator counts on a notice for a rendezvous timeout; a restarted one is told again
  // (what is kept for at least that long still).
  e.notice_ttl = options.rendezvous_timeout;
  e.cache_ttl = 2 * (options.rendezvous_timeout + options.peer_timeout);
  e.formation_timeout = FormationTimeout(options.peer_timeout);
  // A step that comes while the fleet re-forms waits for it (no retry, no backoff) for as long as
  // a lost rank or coordinator takes to be replaced.
  e.formation_hold = options.peer_timeout;
  if (options.election.enabled) e.max_backoff = absl::Milliseconds(200);
  if (Coordinator* coordinator = fleet->coordinator_.get()) {
    e.on_step_applied = [coordinator](int64_t index) { coordinator->BatchRan(index); };
  } else if (options.election.enabled) {
    // The seat this rank holds, while it coordinates (an index of an earlier term's log may
    // reach it at a change of term: pacing, never a result, depends on it).
    e.on_step_applied = [fleet = fleet.get()](int64_t index) {
      if (std::shared_ptr<const CoordinatorSeat> seat = fleet->seat()) seat->coordinator->BatchRan(index);
    };
  }
  // Lone matrices forwarded to a rank that is lost are computed here at once, not at the
  // collective timeout (the executor goes before the peer client: ~Fleet).
  e.on_membership = [peers = fleet->peers_.get()](const std::vector<Member>& members, bool graceful) {
    peers->Generation(members, graceful);
  };
  ASSIGN_OR_RETURN(fleet->executor_, Executor::Create(e));
  if (options.election.enabled) {
    RETURN_IF_ERROR(fleet->StartElection(e.self.incarnation));
    LOG_INFO("fleet") << "rank " << options.rank << " of up to " << options.world
                      << " joins the fleet whose coordinator etcd elects (" << options.election.etcd.endpoints
                      << ", prefix " << options.election.prefix << "; " << options.collective << ")";
  } else if (options.world > 1) {
    LOG_INFO("fleet") << "rank " << options.rank << " of up to " << options.world << " joins the fleet through "
                      << (options.rank == 0 ? "its own coordinator" : options.coordinator) << " (" << options.collective
                      << ")";
  } else {
    const absl::Time deadline = absl::Now() + kLocalFormation;
    while (!fleet->ready() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    if (!fleet->ready()) return absl::InternalError("the one-rank fleet did not form");
  }
  return fleet;
}

Coordinator::Options Fleet::CoordinatorOptions(uint64_t epoch, int home_rank) const {
  const Options& options = options_;
  Coordinator::Options c;
  c.epoch = epoch;
  c.home_rank = home_rank;
  c.fleet_world = options.world;
  c.rendezvous_timeout = options.rendezvous_timeout;
  c.stall_warning = options.stall_warning;
  c.peer_timeout = options.peer_timeout;
  c.quarantine_after = options.quarantine_after;
  c.quarantine_window = std::max(absl::Seconds(60), 4 * FormationTimeout(options.peer_timeout));
  c.quarantine_base = options.quarantine_base;
  c.quarantine_max = options.quarantine_max;
  if (options.world == 1) c.reform_delay = absl::ZeroDuration();
  // Fleets of several ranks order their batches fairly (one appended ahead of the coordinator's
  // own executor); a one-rank fleet computes lone steps in the compute queue, and groups there
  // are appended as they complete.
  c.batch_window = options.world > 1 ? options.batch_window : 0;
  c.shares = options.tenant_shares;
  c.part_time = options.batch_part_time;
  c.max_tenant_pending_steps = options.max_tenant_pending_steps;
  c.max_entry_bytes = std::min(options.max_entry_bytes, kMaxFleetEntryBytes);
  if (Metrics* metrics = options.metrics; metrics != nullptr) {
    c.on_rendezvous_timeout = [metrics] { metrics->RendezvousTimeout(); };
    c.on_generation = [metrics](const Generation&, const std::string& reason) { metrics->Reformation(reason); };
    c.on_refusal = [metrics](const char* cause) { metrics->IntegrityRefused(cause); };
    c.on_quarantine = [metrics](int rank) { metrics->Quarantined(rank); };
  }
  return c;
}

std::string Fleet::FleetAddress() const {
  std::string host = HostOf(options_.fleet_listen);
  if (IsWildcard(host)) host = HostOf(options_.advertise_address);
  if (IsWildcard(host)) host = "127.0.0.1";
  return JoinHostPort(host, fleet_port_);
}

absl::Status Fleet::StartElection(uint64_t incarnation) {
  const Options::Election& e = options_.election;
  EtcdLeadership::Options l;
  l.etcd = e.etcd;
  l.prefix = e.prefix;
  l.world = options_.world;
  l.rank = options_.rank;
  l.address = FleetAddress();
  l.ttl = e.ttl > absl::ZeroDuration() ? e.ttl : std::max(absl::Seconds(1), options_.peer_timeout / 2);
  // An answer later than the lease's TTL is of no use to a leadership, and a leaving rank must
  // not wait long for etcd: calls are bounded by the TTL (1 to 5 s), connecting by 1 s.
  l.etcd.call_timeout = std::clamp(l.ttl, absl::Seconds(1), absl::Seconds(5));
  l.etcd.dial_timeout = std::min(l.etcd.dial_timeout, absl::Seconds(1));
  l.on_elected = [this](int64_t term) { Elected(term); };
  l.on_deposed = [this](int64_t term, const absl::Status&) { Deposed(term); };
  l.on_leader = [this](const LeaderInfo& leader) { LeaderIs(leader); };
  // Liveness: this process's key in etcd, and, while this rank coordinates, every member whose
  // key is gone (its lease ended) is lost at once rather than after the peer timeout.
  l.incarnation = incarnation;
  l.on_listed = [this](const absl::flat_hash_map<int, uint64_t>& listed) {
    if (std::shared_ptr<const CoordinatorSeat> s = seat()) s->coordinator->Listed(listed);
  };
  if (Metrics* metrics = options_.metrics; metrics != nullptr) {
    l.on_reachability = [metrics](const absl::Status& status, absl::Time since) {
      metrics->fleet_etcd_unreachable_since().Set(status.ok() ? 0.0 : absl::ToDoubleSeconds(since - absl::UnixEpoch()));
    };
    l.on_refused = [metrics](absl::string_view) { metrics->IntegrityRefused("etcd_value"); };
  }
  ASSIGN_OR_RETURN(leadership_, EtcdLeadership::Start(std::move(l)));
  return absl::OkStatus();
}

std::shared_ptr<const CoordinatorSeat> Fleet::seat() const {
  absl::MutexLock lock(&mu_);
  return seat_;
}

void Fleet::Elected(int64_t term) {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(CoordinatorOptions(static_cast<uint64_t>(term), options_.rank));
  if (!coordinator.ok()) {
    // Options were checked when the fleet was made; this cannot fail for another reason.
    LOG_ERROR("fleet") << "cannot coordinate the fleet: " << coordinator.status();
    return;
  }
  auto seat = std::make_shared<CoordinatorSeat>();
  seat->coordinator = std::move(*coordinator);
  seat->store = std::make_shared<InMemoryStore>();
  {
    absl::MutexLock lock(&mu_);
    seat_ = seat;
  }
  if (Metrics* metrics = options_.metrics; metrics != nullptr) metrics->fleet_coordinator().Set(1);
  link_->Follow(term, options_.rank, FleetAddress(), seat);
  executor_->CoordinatorMoved();
}

void Fleet::Deposed(int64_t term) {
  std::shared_ptr<const CoordinatorSeat> seat;
  {
    absl::MutexLock lock(&mu_);
    seat = std::move(seat_);
    seat_.reset();
    if (seat != nullptr) retired_.push_back(seat);
  }
  if (Metrics* metrics = options_.metrics; metrics != nullptr) metrics->fleet_coordinator().Set(0);
  if (seat == nullptr) return;
  // Its members' waiting reads are answered now and it appends nothing more; they find the next
  // coordinator through etcd.
  seat->coordinator->Shutdown();
  seat->store->StopWaits();
  LOG_INFO("fleet") << "the coordinator of term " << term << " on this rank stopped";
}

void Fleet::LeaderIs(const LeaderInfo& leader) {
  std::shared_ptr<const CoordinatorSeat> local;
  {
    absl::MutexLock lock(&mu_);
    if (leader.rank == options_.rank && seat_ != nullptr &&
        seat_->coordinator->epoch() == static_cast<uint64_t>(leader.term)) {
      local = seat_;
    }
  }
  if (Metrics* metrics = options_.metrics; metrics != nullptr) metrics->fleet_coordinator_term().Set(leader.term);
  if (leader.rank < 0) {
    // EtcdLeadership has said why (its log): no rank coordinates in this term.
    LOG_INFO("fleet") << "no rank coordinates the fleet in etcd term " << leader.term;
  } else {
    LOG_INFO("fleet") << "etcd names rank " << leader.rank << " at " << leader.address
                      << " the fleet coordinator (term " << leader.term << ")";
  }
  link_->Follow(leader.term, leader.rank, leader.address, local);
  executor_->CoordinatorMoved();
}

FleetCoordinatorInfo Fleet::coordinator_info() const {
  FleetCoordinatorInfo info;
  if (leadership_ == nullptr) {
    info.rank = options_.world > 1 || coordinator_ != nullptr ? 0 : -1;
    return info;
  }
  info.elected = true;
  const LeaderInfo leader = leadership_->leader();
  info.rank = leader.rank;
  info.term = leader.term;
  const absl::Status status = leadership_->etcd_status();
  info.etcd_reachable = status.ok();
  info.etcd_unreachable_since = leadership_->unreachable_since();
  info.etcd_error = std::string(status.message());
  return info;
}

CollectiveFactory Fleet::MakeCollectiveFactory() const {
  const Options& o = options_;
  std::string host = HostOf(o.fleet_listen);
  if (IsWildcard(host)) host = HostOf(o.advertise_address);
  const std::string hostname = IsWildcard(host) ? "127.0.0.1" : host;
  std::shared_ptr<Store> store = store_;
  const std::string kind = o.collective;
  const int device = o.device;
  auto make = [store, hostname, kind, device](const CollectiveGroup& group,
                                              absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Collective>> {
    if (group.world == 1) return std::unique_ptr<Collective>(std::make_unique<LocalCollective>());
    const absl::Duration timeout = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    if (kind == "nccl") {
#if ORTHOSERVE_WITH_CUDA
      NcclCollective::Options n;
      n.rank = group.index;
      n.world = group.world;
      n.device = device;
      n.store = store.get();
      n.id_key = absl::StrCat(group.prefix, "/nccl/unique_id");
      n.init_timeout = timeout;
      ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> nccl, NcclCollective::Create(n));
      return std::unique_ptr<Collective>(std::move(nccl));
#else
      (void)device;
      return absl::FailedPreconditionError("collective nccl: this build has no NCCL");
#endif
    }
    GlooCollective::Options g;
    g.rank = group.index;
    g.world = group.world;
    g.store = store.get();
    g.prefix = group.prefix;
    g.hostname = hostname;
    // Gloo bounds each rendezvous step by this; its pair connect by a multiple of it, so the
    // executor gives up on a join that overruns (see Executor::JoinCollective).
    g.timeout = timeout;
    ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> gloo, GlooCollective::Create(g));
    return std::unique_ptr<Collective>(std::move(gloo));
  };
  Metrics* metrics = o.metrics;
  if (metrics == nullptr) return make;
  // Every call of the generation's collective, whichever implementation, is timed by operation.
  return [make, metrics](const CollectiveGroup& group,
                         absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Collective>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Collective> collective, make(group, deadline));
    return std::unique_ptr<Collective>(std::make_unique<TimedCollective>(
        std::move(collective),
        [metrics](absl::string_view op, absl::Duration duration) { metrics->CollectiveTime(op, duration); }));
  };
}

absl::Status Fleet::ServeFleetPort() {
  if (options_.fleet_listen.empty()) return absl::OkStatus();
  // Every rank answers grpc.health.v1 here while its process runs and is not wedged (the
  // liveness signal, independent of membership); rank 0 of a multi-rank fleet also serves the
  // fleet service, and every member of one the Peer service. With fleet TLS all of it, health
  // included, is mutual TLS: a liveness probe presents a fleet certificate too.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.fleet_listen,
                           tls_ != nullptr ? tls_->ServerCredentials() : grpc::InsecureServerCredentials(),
                           &fleet_port_);
  // Without this gRPC binds with SO_REUSEPORT, and a second server on a busy port would start
  // silently and share its traffic; a port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kFleetMessageBytes);
  builder.SetMaxSendMessageSize(kFleetMessageBytes);
  if (options_.election.enabled) {
    // Every rank may be elected: each serves the seat it holds, if any.
    fleet_service_ =
        std::make_unique<FleetService>([this] { return seat(); }, FleetService::kMaxReadBytes, access_.get());
    builder.RegisterService(fleet_service_.get());
  } else if (options_.rank == 0 && options_.world > 1) {
    fleet_service_ =
        std::make_unique<FleetService>(served_store_.get(), coordinator_.get(), FleetService::kMaxReadBytes, access_.get());
    builder.RegisterService(fleet_service_.get());
  }
  if (options_.world > 1 && options_.compute != nullptr) {
    peer_service_ = std::make_unique<PeerService>(options_.backend, options_.compute, options_.metrics, access_.get());
    builder.RegisterService(peer_service_.get());
  }
  fleet_server_ = builder.BuildAndStart();
  if (fleet_server_ == nullptr || fleet_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--fleet-listen ", options_.fleet_listen, " cannot be bound",
                     tls_ != nullptr ? " (or --fleet-tls-key is not the key of --fleet-tls-cert)" : ""));
  }
  return absl::OkStatus();
}

Fleet::~Fleet() {
  Shutdown();
  // The executor goes first (it uses the log and the collective), then the coordinator's
  // service (its handlers return at once after the coordinator's shutdown).
  executor_.reset();
  if (fleet_server_ != nullptr) fleet_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Fleet::Shutdown() {
  if (shutdown_.exchange(true)) return;
  if (executor_ != nullptr) executor_->Shutdown();
  // Resigns if elected (its seat is shut down by Deposed) and stops campaigning and following.
  if (leadership_ != nullptr) leadership_->Stop();
  if (coordinator_ != nullptr) coordinator_->Shutdown();  // Its waiting readers are answered now,
  if (served_store_ != nullptr) served_store_->StopWaits();  // and the store's waiting getters.
}

bool Fleet::ready() const {
  if (shutdown_.load() || executor_ == nullptr) return false;
  return executor_->view().formed;
}

bool Fleet::takes_group_steps() const {
  if (shutdown_.load() || executor_ == nullptr) return false;
  return executor_->TakesSteps();
}

int64_t Fleet::generation() const { return executor_ == nullptr ? 0 : executor_->view().generation; }

size_t Fleet::generation_size() const { return executor_ == nullptr ? 0 : executor_->view().members.size(); }

grpc::HealthCheckServiceInterface* Fleet::liveness_service() const {
  return fleet_server_ == nullptr ? nullptr : fleet_server_->GetHealthCheckService();
}

absl::Status Fleet::Liveness() const { return executor_ == nullptr ? absl::OkStatus() : executor_->Liveness(); }

absl::Status Fleet::Leave(absl::Duration timeout) {
  if (executor_ == nullptr) return absl::OkStatus();
  if (leadership_ != nullptr) {
    if (leadership_->leading_term() != 0) {
      // The elected coordinator: its executor stops first (steps waiting on it fail as
      // UNAVAILABLE and are retried on other members), so that it does not join its successor,
      // then it resigns: the successor is elected at once, without waiting for the lease TTL,
      // and forms the next generation from the members that join it.
      executor_->Shutdown();
      leadership_->Resign();
      return absl::OkStatus();
    }
    // Never elected while it leaves (its candidacy goes at once); it follows etcd until it shuts
    // down, so that it leaves through whichever rank coordinates.
    leadership_->Resign();
  }
  if (options_.world == 1) return absl::OkStatus();
  return executor_->Leave(timeout);
}

std::vector<FleetMemberInfo> Fleet::members() const {
  Executor::View view = executor_ == nullptr ? Executor::View{} : executor_->view();
  absl::MutexLock lock(&mu_);
  std::vector<FleetMemberInfo> out(options_.world);
  for (int r = 0; r < options_.world; ++r) out[r].rank = r;
  for (const Member& m : view.members) {
    if (m.rank < 0 || m.rank >= options_.world) continue;
    addresses_[m.rank] = m.address;
    out[m.rank].ready = true;
  }
  addresses_[options_.rank] = self_address_;
  for (int r = 0; r < options_.world; ++r) out[r].address = addresses_[r];
  return out;
}

void Fleet::SetLocalAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (options_.world != 1) return;
  self_address_ = address;
}

size_t Fleet::waiting() const { return executor_ == nullptr ? 0 : executor_->waiting(); }

void Fleet::Submit(std::shared_ptr<TrainerStep> step, StepCallback done) { executor_->Submit(std::move(step), std::move(done)); }

void Fleet::AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason, uint64_t submission) {
  executor_->AbortStep(key, trainer_rank, reason, submission);
}

std::shared_ptr<const LoneTarget> Fleet::PickLoneRank(double cost) {
  std::vector<Member> members;
  if (options_.world > 1 && executor_ != nullptr && !shutdown_.load()) {
    Executor::View view = executor_->view();
    if (view.member && view.formed) members = std::move(view.members);
  }
  // Members come from the coordinator's log: a rank outside this fleet is never a target.
  members.erase(std::remove_if(members.begin(), members.end(),
                               [this](const Member& m) { return m.rank < 0 || m.rank >= options_.world; }),
                members.end());
  return lone_.Pick(members, cost);
}

void Fleet::ComputeOnPeer(const LoneTarget& target, const PeerMatrix& matrix,
                          std::function<void(absl::StatusOr<PeerResult>)> done) {
  peers_->Compute(target.address, target.rank, matrix, std::move(done));
}

}  // namespace orthoserve
