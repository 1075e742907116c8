// A trainer rank's view of a server fleet: discovers the fleet from any one endpoint and sends
// each step to the fleet rank that serves this trainer rank, floor(r·S/W) (DESIGN §3).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/client.h"

namespace orthoserve::client {

// Thread-safe: steps of different groups may run at once.
class GroupClient {
 public:
  struct Options {
    ClientOptions client;  // Options of every connection; `client.address` is the seed endpoint.
  };

  // Connects to the seed, asks it for the fleet (GetServerInfo) and prepares one client per
  // member. The seed's RPC status on failure; FAILED_PRECONDITION when the membership is unusable
  // (fleet_world < 1, members that do not list ranks 0..S-1 in order, an empty address).
  static absl::StatusOr<std::unique_ptr<GroupClient>> Create(const Options& options);

  // Builds a group client from a ServerInfo already obtained (tests, callers that cache it),
  // with the same checks as Create. `seed` (may be null) serves its own fleet rank.
  static absl::StatusOr<std::unique_ptr<GroupClient>> CreateFromInfo(const Options& options, const v1::ServerInfo& info,
                                                                     std::unique_ptr<Client> seed);

  // One step of trainer rank `rank` of a `world`-rank group, sent to fleet rank
  // FleetRankOfTrainer(rank, world, fleet_world()). Returns what Client::Step returns;
  // INVALID_ARGUMENT for rank/world out of range.
  absl::StatusOr<std::vector<MatrixOutput>> Step(const std::string& job, const std::string& group, int64_t step,
                                                 int rank, int world, absl::Span<const MatrixInput> inputs,
                                                 const ResultCallback& on_result = nullptr);

  int fleet_world() const { return static_cast<int>(members_.size()); }
  // The address of fleet rank `fleet_rank` (0 <= fleet_rank < fleet_world()).
  const std::string& member_address(int fleet_rank) const { return members_[fleet_rank]; }
  // The fleet rank trainer rank `rank` of a `world`-rank group streams to.
  int FleetRankFor(int rank, int world) const;
  // The connection to fleet rank `fleet_rank` (0 <= fleet_rank < fleet_world()); owned here.
  Client* member_client(int fleet_rank) const { return clients_[fleet_rank].get(); }

 private:
  GroupClient(std::vector<std::string> members, std::vector<std::unique_ptr<Client>> clients);
  std::vector<std::string> members_;
  std::vector<std::unique_ptr<Client>> clients_;
};

}  // namespace orthoserve::client
