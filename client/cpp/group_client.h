// A trainer rank's view of a server fleet: discovers the fleet from any one endpoint and sends
// each step to a ready member; on a retryable failure it re-reads the membership and retries the
// step there (the service comment of proto/orthoserve/v1/orthogonalizer.proto; docs/architecture.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/client.h"
#include "client/cpp/retry.h"

namespace orthoserve::client {

// Routing. Trainer rank r of a W-rank group streams to the ready member (members[].ready of
// GetServerInfo: a member of the fleet's current generation) at position floor(r·M/W) of the M
// ready members in rank order; when none is marked ready, to the member at floor(r·S/W) of all S
// listed members. With every member ready this is fleet rank floor(r·S/W).
//
// Retries. Step retries retryable failures (UNAVAILABLE; ABORTED with the fleet-change trailing
// metadata; CANCELLED) and attempts that ran out of their own `client.timeout` (DEADLINE_EXCEEDED;
// RetryLoop) under `Options::client.retry`, like Client::Step: after each backoff it re-reads the
// membership with GetServerInfo, asking the member it used, then the other members, then the seed
// addresses (the first answer from a rank that reports itself ready wins; otherwise the first usable
// answer; with none the membership stays), routes again, passing over the member the failed
// attempt went to for the next ready one while there is another, and sends the whole step with
// StepHeader.attempt + 1. Connections to addresses not seen before are made as needed.
//
// Shared-memory regions (region.h; docs/shared_memory.md): a step whose inputs name region slices
// (made on a member's connection, member_client(fleet_rank)->CreateRegion) goes to that region's
// member on every attempt instead (no other member can read the region), and all the slices of
// one step must be of regions on that one member (INVALID_ARGUMENT otherwise).
//
// Thread-safe: steps of different groups may run at once, and the membership may change under
// them. Connections live as long as the GroupClient.
class GroupClient {
 public:
  struct Options {
    ClientOptions client;  // Every connection's; `address` (or `addresses`, tried in turn): the seed.
    absl::Duration membership_timeout = absl::Seconds(10);  // Each GetServerInfo re-reading the membership.
    // The run id of every step (StepHeader.run_id): the same on every trainer rank of the run and
    // on no other run. Empty: DefaultRunId() (client/cpp/run_id.h: $ORTHOSERVE_RUN_ID,
    // $TORCHELASTIC_RUN_ID, else random per process, which ranks in separate processes do not share).
    std::string run_id;
  };

  // Connects to the seed, asks it for the fleet (GetServerInfo, with retries and fail-over
  // between the seed addresses) and prepares one client per member; the seed address that
  // answered is the seed from then on. The seed's RPC status on failure; FAILED_PRECONDITION when the membership is
  // unusable (see CreateFromInfo); INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<GroupClient>> Create(const Options& options);

  // Builds a group client from a ServerInfo already obtained (tests, callers that cache it).
  // `seed` (may be null) is the connection the info came from; it serves its own fleet rank (that
  // rank's advertised address is reached through the seed's address from then on).
  // FAILED_PRECONDITION when the membership is unusable: fleet_world < 1, no members listed for a
  // fleet_world > 1 (a one-rank fleet may leave them implicit: the seed), members not listed in
  // increasing rank order, an empty address. INVALID_ARGUMENT for bad options (as Client::Create,
  // or a non-positive membership_timeout).
  static absl::StatusOr<std::unique_ptr<GroupClient>> CreateFromInfo(const Options& options, const v1::ServerInfo& info,
                                                                     std::unique_ptr<Client> seed);

  // One step of trainer rank `rank` of a `world`-rank group, routed as above and retried as above.
  // Returns what Client::Step returns (each index passed to `on_result` once across attempts);
  // INVALID_ARGUMENT for rank/world out of range; the last failure, with "after N attempts: " in
  // front of its message, when the retries are spent.
  absl::StatusOr<std::vector<MatrixOutput>> Step(const std::string& job, const std::string& group, int64_t step,
                                                 int rank, int world, absl::Span<const MatrixInput> inputs,
                                                 const ResultCallback& on_result = nullptr);

  // The membership as last read. The number of members listed (S).
  int fleet_world() const;
  // The address of fleet rank `fleet_rank`; empty when no such member is listed.
  std::string member_address(int fleet_rank) const;
  // Whether fleet rank `fleet_rank` is listed and ready.
  bool member_ready(int fleet_rank) const;
  // ServerInfo.fleet_generation of the last membership read.
  int64_t fleet_generation() const;
  // The fleet rank trainer rank `rank` of a `world`-rank group streams to now; -1 for rank/world
  // out of range.
  int FleetRankFor(int rank, int world) const;
  // The connection to fleet rank `fleet_rank`; null when no such member is listed. Owned here,
  // valid as long as the GroupClient.
  Client* member_client(int fleet_rank) const;

  // Retries made by Step so far (all groups together).
  int64_t retries() const { return retries_.load(std::memory_order_relaxed); }

 private:
  struct Member {
    int rank = 0;
    std::string address;  // The address dialled (the seed's for the seed's own rank).
    bool ready = false;
  };
  struct Route {
    int fleet_rank = 0;
    std::string address;
    Client* client = nullptr;
  };

  explicit GroupClient(const Options& options);

  // The members `info` lists (or the implicit one of a one-rank fleet, at `answered_by`), checked
  // as CreateFromInfo describes.
  static absl::StatusOr<std::vector<Member>> MembersFromInfo(const v1::ServerInfo& info,
                                                             const std::string& answered_by);
  // Installs a membership read, mapping the seed rank's advertised address to the seed's.
  void SetMembership(std::vector<Member> members, int64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The connection to `address`, made on first use.
  absl::StatusOr<Client*> ClientFor(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member trainer rank `rank` of `world` streams to (members_ is never empty): the ready
  // member at floor(r·M/W), or the next ready one when that is `avoid` (where the last attempt
  // failed) and there is another; while none is ready (a re-formation), the same rule over every
  // member.
  const Member& Pick(int rank, int world, const std::string& avoid = "") const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Route> RouteFor(int rank, int world, const std::string& avoid);
  // The route to `address` (the member whose regions a step names).
  absl::StatusOr<Route> RouteTo(const std::string& address);
  // Re-reads the membership after a failure at `failed_address` (see the class comment).
  void RefreshMembership(const std::string& failed_address, absl::Duration timeout);

  const Options options_;
  const std::shared_ptr<RetryEnvironment> retry_environment_;
  std::atomic<int64_t> retries_{0};
  mutable absl::Mutex mu_;
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);  // In increasing rank order; never empty.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Advertised address -> the address dialled instead (the seed's own rank).
  absl::flat_hash_map<std::string, std::string> aliases_ ABSL_GUARDED_BY(mu_);
  // Every connection made, by address; never removed, so the pointers handed out stay valid.
  absl::flat_hash_map<std::string, std::unique_ptr<Client>> clients_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orthoserve::client
