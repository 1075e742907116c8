// Implementation of client/cpp/group_client.h.
#include "client/cpp/group_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shape.h"
#include "common/status.h"

namespace orthoserve::client {

absl::StatusOr<std::unique_ptr<GroupClient>> GroupClient::Create(const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> seed, Client::Create(options.client));
  absl::StatusOr<v1::ServerInfo> info = seed->GetServerInfo();
  if (!info.ok())
    return Annotate(info.status(), absl::StrCat("discovering the fleet through ", options.client.address));
  return CreateFromInfo(options, *info, std::move(seed));
}

absl::StatusOr<std::unique_ptr<GroupClient>> GroupClient::CreateFromInfo(const Options& options,
                                                                         const v1::ServerInfo& info,
                                                                         std::unique_ptr<Client> seed) {
  const int world = info.fleet_world();
  if (world < 1) {
    return absl::FailedPreconditionError(absl::StrCat("server reports fleet_world ", world, "; is the fleet formed?"));
  }
  std::vector<std::string> members(world);
  if (info.members_size() == 0 && world == 1) {
    members[0] = options.client.address;  // A one-rank fleet may leave its membership implicit.
  } else {
    if (info.members_size() != world) {
      return absl::FailedPreconditionError(
          absl::StrCat("server lists ", info.members_size(), " fleet members for fleet_world ", world));
    }
    for (int r = 0; r < world; ++r) {
      const v1::FleetMember& m = info.members(r);
      if (m.rank() != r) {
        return absl::FailedPreconditionError(
            absl::StrCat("fleet member ", r, " reports rank ", m.rank(), "; members must be ordered by rank"));
      }
      if (m.address().empty()) {
        return absl::FailedPreconditionError(absl::StrCat("fleet rank ", r, " has no public address"));
      }
      members[r] = m.address();
    }
  }
  std::vector<std::unique_ptr<Client>> clients(world);
  const int seed_rank = info.fleet_rank();
  for (int r = 0; r < world; ++r) {
    if (r == seed_rank && seed != nullptr) {
      clients[r] = std::move(seed);
      members[r] = clients[r]->options().address;
      continue;
    }
    ClientOptions o = options.client;
    o.address = members[r];
    ASSIGN_OR_RETURN(clients[r], Client::Create(o));
  }
  return std::unique_ptr<GroupClient>(new GroupClient(std::move(members), std::move(clients)));
}

GroupClient::GroupClient(std::vector<std::string> members, std::vector<std::unique_ptr<Client>> clients)
    : members_(std::move(members)), clients_(std::move(clients)) {}

int GroupClient::FleetRankFor(int rank, int world) const { return FleetRankOfTrainer(rank, world, fleet_world()); }

absl::StatusOr<std::vector<MatrixOutput>> GroupClient::Step(const std::string& job, const std::string& group,
                                                            int64_t step, int rank, int world,
                                                            absl::Span<const MatrixInput> inputs,
                                                            const ResultCallback& on_result) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", rank, " of world ", world, " is invalid; need 0 <= rank < world"));
  }
  StepOptions options{job, group, step, rank, world};
  return clients_[FleetRankFor(rank, world)]->Step(options, inputs, on_result);
}

}  // namespace orthoserve::client
