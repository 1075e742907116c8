// Implementation of server/fleet/fleet.h.
#include "server/fleet/fleet.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "server/collective/gloo/gloo_collective.h"
#include "server/collective/in_memory_store.h"
#include "server/collective/local_collective.h"
#if ORTHOSERVE_WITH_CUDA
#include "server/collective/nccl/nccl_collective.h"
#endif
#include "server/fleet/fleet_client.h"
#include "server/fleet/fleet_service.h"

namespace orthoserve {
namespace {

// "host:port" or "[v6]:port" → host (brackets removed).
std::string HostOf(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

bool IsWildcard(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::"; }

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
  if (options.world > 1 && options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator is required when --world > 1: give rank 0's fleet address (its --fleet-listen)");
  }
  if (options.world > 1 && options.fleet_listen.empty()) {
    return absl::InvalidArgumentError("--fleet-listen is required when --world > 1 (this rank's internal address)");
  }
  std::unique_ptr<Fleet> fleet(new Fleet(options));
  Coordinator::Options c;
  c.fleet_world = options.world;
  c.rendezvous_timeout = options.rendezvous_timeout;
  c.stall_warning = options.stall_warning;
  Metrics* metrics = options.metrics;
  if (metrics != nullptr) {
    c.on_rendezvous_timeout = [metrics] { metrics->RendezvousTimeout(); };
    metrics->fleet_size().Set(options.world);
  }

  if (options.rank == 0) {
    ASSIGN_OR_RETURN(fleet->coordinator_, Coordinator::Create(c));
    fleet->store_ = std::make_unique<InMemoryStore>();
    fleet->log_ = std::make_unique<LocalLogSource>(fleet->coordinator_.get());
  }
  if (options.world == 1) {
    fleet->collective_ = std::make_unique<LocalCollective>();
    RETURN_IF_ERROR(fleet->ServeFleetPort());
    RETURN_IF_ERROR(fleet->Form());
    return fleet;
  }
  if (options.rank != 0) {
    auto channel = MakeFleetChannel(options.coordinator);
    fleet->store_ = std::make_unique<GrpcStore>(channel);
    fleet->log_ = std::make_unique<RemoteLogSource>(channel);
  }
  RETURN_IF_ERROR(fleet->ServeFleetPort());
  Fleet* raw = fleet.get();
  fleet->formation_ = std::thread([raw] {
    absl::Status formed = raw->Form();
    if (!formed.ok() && !raw->shutdown_.load()) {
      LOG_ERROR("fleet") << "fleet formation failed: " << formed;
    }
    std::lock_guard<std::mutex> lock(raw->mu_);
    raw->formation_status_ = formed;
  });
  return fleet;
}

absl::Status Fleet::ServeFleetPort() {
  if (options_.fleet_listen.empty()) return absl::OkStatus();
  // Every rank answers grpc.health.v1 here while its process runs (a liveness signal that does
  // not depend on fleet formation); rank 0 of a multi-rank fleet also serves the fleet service.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.fleet_listen, grpc::InsecureServerCredentials(), &fleet_port_);
  // Without this gRPC binds with SO_REUSEPORT, and a second server on a busy port would start
  // silently and share its traffic; a port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  if (options_.rank == 0 && options_.world > 1) {
    fleet_service_ = std::make_unique<FleetService>(store_.get(), coordinator_.get());
    builder.RegisterService(fleet_service_.get());
  }
  fleet_server_ = builder.BuildAndStart();
  if (fleet_server_ == nullptr || fleet_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--fleet-listen ", options_.fleet_listen, " cannot be bound"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Collective>> Fleet::JoinCollective() {
  const Options& o = options_;
  if (o.collective == "nccl") {
#if ORTHOSERVE_WITH_CUDA
    NcclCollective::Options n;
    n.rank = o.rank;
    n.world = o.world;
    n.device = o.device;
    n.store = store_.get();
    n.id_key = "gen-0/nccl/unique_id";
    n.init_timeout = o.join_timeout;
    LOG_INFO("fleet") << "joining a fleet of " << o.world << " ranks through " << o.coordinator << " (nccl on device "
                      << o.device << ")";
    ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> nccl, NcclCollective::Create(n));
    return std::unique_ptr<Collective>(std::move(nccl));
#else
    return absl::FailedPreconditionError("collective nccl: this build has no NCCL");
#endif
  }
  GlooCollective::Options g;
  g.rank = o.rank;
  g.world = o.world;
  g.store = store_.get();
  g.prefix = "gen-0";
  std::string host = HostOf(o.fleet_listen);
  if (IsWildcard(host)) host = HostOf(o.advertise_address);
  g.hostname = IsWildcard(host) ? "127.0.0.1" : host;
  g.timeout = o.join_timeout;
  LOG_INFO("fleet") << "joining a fleet of " << o.world << " ranks through " << o.coordinator << " (gloo on "
                    << g.hostname << ")";
  ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> gloo, GlooCollective::Create(g));
  return std::unique_ptr<Collective>(std::move(gloo));
}

absl::Status Fleet::Form() {
  const Options& o = options_;
  if (o.world > 1) {
    RETURN_IF_ERROR(store_->Set(absl::StrCat("member/", o.rank), o.advertise_address));
    ASSIGN_OR_RETURN(collective_, JoinCollective());
  }
  std::vector<FleetMemberInfo> members;
  for (int r = 0; r < o.world; ++r) {
    std::string address = o.advertise_address;
    if (o.world > 1) {
      ASSIGN_OR_RETURN(address, store_->Get(absl::StrCat("member/", r), o.join_timeout));
    }
    members.push_back(FleetMemberInfo{r, address, true});
  }
  Executor::Options e;
  e.fleet_rank = o.rank;
  e.backend = o.backend;
  e.collective = collective_.get();
  e.log = log_.get();
  e.metrics = o.metrics;
  e.execute.collective_timeout = o.collective_timeout;
  ASSIGN_OR_RETURN(std::unique_ptr<Executor> executor, Executor::Create(e));
  {
    std::lock_guard<std::mutex> lock(mu_);
    members_ = std::move(members);
    executor_ = std::move(executor);
  }
  ready_.store(true);
  if (o.metrics != nullptr) {
    o.metrics->fleet_members_ready().Set(o.world);
    o.metrics->fleet_ready().Set(1);
  }
  LOG_INFO("fleet") << "fleet formed: rank " << o.rank << " of " << o.world;
  return absl::OkStatus();
}

Fleet::~Fleet() {
  Shutdown();
  if (formation_.joinable()) formation_.join();
  // The executor goes first (it uses the collective, the log and the coordinator).
  executor_.reset();
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  if (fleet_server_ != nullptr) fleet_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Fleet::Shutdown() {
  shutdown_.store(true);
  ready_.store(false);
  std::lock_guard<std::mutex> lock(mu_);
  if (executor_ != nullptr) executor_->Shutdown();
}

absl::Status Fleet::formation_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return formation_status_;
}

absl::Status Fleet::Health() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!formation_status_.ok()) return formation_status_;
  if (executor_ == nullptr || options_.world == 1) return absl::OkStatus();
  RETURN_IF_ERROR(executor_->Health(options_.peer_timeout));
  if (coordinator_ != nullptr) {
    std::vector<int> silent = coordinator_->SilentReaders(options_.peer_timeout);
    if (!silent.empty()) {
      return absl::UnavailableError(absl::StrCat("fleet rank ", silent[0], " has not been heard from for over ",
                                                 absl::FormatDuration(options_.peer_timeout)));
    }
  }
  return absl::OkStatus();
}

std::vector<FleetMemberInfo> Fleet::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!members_.empty()) return members_;
  std::vector<FleetMemberInfo> pending;
  for (int r = 0; r < options_.world; ++r) {
    pending.push_back(FleetMemberInfo{r, r == options_.rank ? options_.advertise_address : "", false});
  }
  return pending;
}

void Fleet::SetLocalAddress(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.world != 1) return;
  for (FleetMemberInfo& m : members_) {
    if (m.rank == options_.rank) m.address = address;
  }
}

size_t Fleet::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return executor_ == nullptr ? 0 : executor_->waiting();
}

void Fleet::Submit(std::shared_ptr<TrainerStep> step, StepCallback done) {
  Executor* executor = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ready_.load()) executor = executor_.get();
  }
  if (executor == nullptr) {
    StepOutcome outcome;
    outcome.status = absl::UnavailableError(absl::StrCat("fleet rank ", options_.rank, " of ", options_.world,
                                                         " is not ready: the fleet has not formed yet"));
    done(std::move(outcome));
    return;
  }
  executor->Submit(std::move(step), std::move(done));
}

void Fleet::AbortStep(const GroupKey& key, int trainer_rank, const absl::Status& reason) {
  if (log_ != nullptr) {
    absl::Status sent = log_->Abort(key, trainer_rank, reason);
    if (!sent.ok()) LOG_WARNING("fleet") << "could not report the abort of " << key.ToString() << ": " << sent;
  }
}

}  // namespace orthoserve
