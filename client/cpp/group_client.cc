// Implementation of client/cpp/group_client.h.
#include "client/cpp/group_client.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/shape.h"
#include "common/status.h"

namespace orthoserve::client {

absl::StatusOr<std::unique_ptr<GroupClient>> GroupClient::Create(const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> seed, Client::Create(options.client));
  absl::StatusOr<v1::ServerInfo> info = seed->GetServerInfo();
  if (!info.ok()) {
    return Annotate(info.status(),
                    absl::StrCat("discovering the fleet through ", absl::StrJoin(seed->addresses(), ", ")));
  }
  if (seed->addresses().size() > 1) {
    // The seed serves the one address that answered; a connection of its own to that address.
    ClientOptions o = options.client;
    o.address = seed->address();
    o.addresses.clear();
    ASSIGN_OR_RETURN(seed, Client::Create(o));
  }
  return CreateFromInfo(options, *info, std::move(seed));
}

absl::StatusOr<std::unique_ptr<GroupClient>> GroupClient::CreateFromInfo(const Options& options,
                                                                         const v1::ServerInfo& info,
                                                                         std::unique_ptr<Client> seed) {
  RETURN_IF_ERROR(ValidateRetryOptions(options.client.retry));
  if (options.membership_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("membership_timeout must be positive (or infinite)");
  }
  const std::string seed_address = seed != nullptr ? seed->address() : ClientAddresses(options.client).front();
  ASSIGN_OR_RETURN(std::vector<Member> members, MembersFromInfo(info, seed_address));
  std::unique_ptr<GroupClient> group(new GroupClient(options));
  absl::MutexLock lock(&group->mu_);
  if (seed != nullptr) {
    for (const Member& m : members) {
      if (m.rank == info.fleet_rank() && m.address != seed_address) group->aliases_[m.address] = seed_address;
    }
    group->clients_[seed_address] = std::move(seed);
  }
  group->SetMembership(std::move(members), info.fleet_generation());
  for (const Member& m : group->members_) RETURN_IF_ERROR(group->ClientFor(m.address).status());
  return group;
}

GroupClient::GroupClient(const Options& options)
    : options_(options),
      retry_environment_(options.client.retry.environment != nullptr ? options.client.retry.environment
                                                                     : MakeSystemRetryEnvironment()) {}

absl::StatusOr<std::vector<GroupClient::Member>> GroupClient::MembersFromInfo(const v1::ServerInfo& info,
                                                                              const std::string& answered_by) {
  const int world = info.fleet_world();
  if (world < 1) {
    return absl::FailedPreconditionError(absl::StrCat("server reports fleet_world ", world, "; is the fleet formed?"));
  }
  std::vector<Member> members;
  if (info.members_size() == 0) {
    if (world != 1) {
      return absl::FailedPreconditionError(absl::StrCat("server lists no fleet members for fleet_world ", world));
    }
    members.push_back(Member{info.fleet_rank(), answered_by, true});  // A one-rank fleet may leave it implicit.
    return members;
  }
  for (int i = 0; i < info.members_size(); ++i) {
    const v1::FleetMember& m = info.members(i);
    if (m.rank() < 0 || (i > 0 && m.rank() <= info.members(i - 1).rank())) {
      return absl::FailedPreconditionError(absl::StrCat("fleet member ", i, " reports rank ", m.rank(),
                                                        "; members must be ordered by rank, each listed once"));
    }
    if (m.address().empty()) {
      return absl::FailedPreconditionError(absl::StrCat("fleet rank ", m.rank(), " has no public address"));
    }
    members.push_back(Member{m.rank(), m.address(), m.ready()});
  }
  return members;
}

void GroupClient::SetMembership(std::vector<Member> members, int64_t generation) {
  for (Member& m : members) {
    auto alias = aliases_.find(m.address);
    if (alias != aliases_.end()) m.address = alias->second;
  }
  auto describe = [](const std::vector<Member>& list) {
    return absl::StrJoin(list, ", ", [](std::string* out, const Member& m) {
      absl::StrAppend(out, m.rank, "@", m.address, m.ready ? "" : " (not ready)");
    });
  };
  const std::string now = describe(members);
  if (!members_.empty() && (generation != generation_ || now != describe(members_))) {
    LOG_INFO("client") << "fleet membership, generation " << generation << ": " << now;
  }
  members_ = std::move(members);
  generation_ = generation;
  // Connect ahead (lazily; no RPC) so that member_client() has them; CreateFromInfo reports errors.
  for (const Member& m : members_) ClientFor(m.address).IgnoreError();
}

absl::StatusOr<Client*> GroupClient::ClientFor(const std::string& address) {
  std::unique_ptr<Client>& client = clients_[address];
  if (client == nullptr) {
    ClientOptions o = options_.client;
    o.address = address;
    o.addresses.clear();
    absl::StatusOr<std::unique_ptr<Client>> made = Client::Create(o);
    if (!made.ok()) {
      clients_.erase(address);
      return made.status();
    }
    client = *std::move(made);
  }
  return client.get();
}

const GroupClient::Member& GroupClient::Pick(int rank, int world, const std::string& avoid) const {
  std::vector<const Member*> ready;
  for (const Member& m : members_) {
    if (m.ready) ready.push_back(&m);
  }
  if (ready.empty()) {
    // The fleet is re-forming: a member holds the step until its generation forms, but the member
    // that just failed may be the one that is gone (it refused the connection): the next one then.
    const int all = static_cast<int>(members_.size());
    const int preferred = FleetRankOfTrainer(rank, world, all);
    if (all > 1 && members_[preferred].address == avoid) return members_[(preferred + 1) % all];
    return members_[preferred];
  }
  const int n = static_cast<int>(ready.size());
  const int preferred = FleetRankOfTrainer(rank, world, n);
  // A member that just failed this step and still looks ready (it is draining, say) is passed
  // over for the next ready one while there is another.
  if (n > 1 && ready[preferred]->address == avoid) return *ready[(preferred + 1) % n];
  return *ready[preferred];
}

absl::StatusOr<GroupClient::Route> GroupClient::RouteTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Client * client, ClientFor(address));
  int fleet_rank = -1;
  for (const Member& m : members_) {
    if (m.address == address) fleet_rank = m.rank;
  }
  return Route{fleet_rank, address, client};
}

absl::StatusOr<GroupClient::Route> GroupClient::RouteFor(int rank, int world, const std::string& avoid) {
  absl::MutexLock lock(&mu_);
  const Member& m = Pick(rank, world, avoid);
  ASSIGN_OR_RETURN(Client * client, ClientFor(m.address));
  return Route{m.rank, m.address, client};
}

void GroupClient::RefreshMembership(const std::string& failed_address, absl::Duration timeout) {
  // The other members, the seeds, and the member the attempt failed on last: a stopped member
  // would hold the read for its whole timeout. Each address once.
  std::vector<Client*> ask;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> addresses;
    for (const Member& m : members_) {
      if (m.address != failed_address) addresses.push_back(m.address);
    }
    for (const std::string& seed : ClientAddresses(options_.client)) {
      if (seed != failed_address) addresses.push_back(seed);
    }
    addresses.push_back(failed_address);
    for (const std::string& address : addresses) {
      absl::StatusOr<Client*> client = ClientFor(address);
      if (client.ok() && std::find(ask.begin(), ask.end(), *client) == ask.end()) ask.push_back(*client);
    }
  }
  std::optional<std::pair<std::vector<Member>, int64_t>> fallback;
  for (Client* client : ask) {
    absl::StatusOr<v1::ServerInfo> info = client->GetServerInfoOnce(timeout);
    absl::StatusOr<std::vector<Member>> members = info.ok() ? MembersFromInfo(*info, client->address()) : info.status();
    if (!members.ok()) {
      VLOG("client", 1) << "re-reading the fleet membership from " << client->address() << ": " << members.status();
      continue;
    }
    if (info->ready()) {  // A rank of the current generation: its view is current.
      absl::MutexLock lock(&mu_);
      SetMembership(*std::move(members), info->fleet_generation());
      return;
    }
    if (!fallback.has_value()) fallback.emplace(*std::move(members), info->fleet_generation());
  }
  if (fallback.has_value()) {
    absl::MutexLock lock(&mu_);
    SetMembership(std::move(fallback->first), fallback->second);
    return;
  }
  LOG_WARNING("client") << "no fleet member answered GetServerInfo; keeping the last membership";
}

absl::StatusOr<std::vector<MatrixOutput>> GroupClient::Step(const std::string& job, const std::string& group,
                                                            int64_t step, int rank, int world,
                                                            absl::Span<const MatrixInput> inputs,
                                                            const ResultCallback& on_result) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", rank, " of world ", world, " is invalid; need 0 <= rank < world"));
  }
  const StepOptions options{job, group, step, rank, world, options_.run_id};
  std::vector<bool> delivered(inputs.size(), false);
  RetryLoop loop(
      options_.client.retry, retry_environment_.get(), options_.client.timeout,
      absl::StrCat("step ", step, " of group ", job, "/", group, " (trainer rank ", rank, " of ", world, ")"),
      &retries_);
  // Where the regions the inputs name are (StepOnce checks that they are all on one address).
  std::string pinned;
  for (const MatrixInput& input : inputs) {
    for (const std::optional<RegionSlice>* slice : {&input.input_region, &input.result_region}) {
      if (pinned.empty() && slice->has_value()) pinned = (*slice)->address;
    }
  }
  std::string failed;  // The member the last attempt failed on.
  while (true) {
    ASSIGN_OR_RETURN(Route route, pinned.empty() ? RouteFor(rank, world, failed) : RouteTo(pinned));
    absl::StatusOr<std::vector<MatrixOutput>> outputs =
        route.client->StepOnce(options, loop.attempt(), loop.AttemptTimeout(), inputs, on_result, &delivered);
    if (outputs.ok()) return outputs;
    if (!loop.BackOff(outputs.status())) return loop.GiveUp(outputs.status());
    failed = route.address;
    RefreshMembership(route.address, std::min(options_.membership_timeout, loop.AttemptTimeout()));
  }
}

int GroupClient::fleet_world() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(members_.size());
}

std::string GroupClient::member_address(int fleet_rank) const {
  absl::MutexLock lock(&mu_);
  for (const Member& m : members_) {
    if (m.rank == fleet_rank) return m.address;
  }
  return "";
}

bool GroupClient::member_ready(int fleet_rank) const {
  absl::MutexLock lock(&mu_);
  for (const Member& m : members_) {
    if (m.rank == fleet_rank) return m.ready;
  }
  return false;
}

int64_t GroupClient::fleet_generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

int GroupClient::FleetRankFor(int rank, int world) const {
  if (world < 1 || rank < 0 || rank >= world) return -1;
  absl::MutexLock lock(&mu_);
  return Pick(rank, world).rank;
}

Client* GroupClient::member_client(int fleet_rank) const {
  absl::MutexLock lock(&mu_);
  for (const Member& m : members_) {
    if (m.rank != fleet_rank) continue;
    auto it = clients_.find(m.address);
    return it == clients_.end() ? nullptr : it->second.get();
  }
  return nullptr;
}

}  // namespace orthoserve::client
