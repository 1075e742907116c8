// Implementation of server/fleet/wire/leader_link.h.
#include "server/fleet/wire/leader_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/fleet/wire/fleet_client.h"

namespace orthoserve {

// One term's coordinator: this process's seat (in process) or a remote one over the fleet port.
struct LeaderLink::Target {
  int64_t term = 0;
  int rank = -1;
  std::string address;
  std::shared_ptr<const CoordinatorSeat> seat;  // Local only.
  RemoteLogSource* remote = nullptr;            // Remote only: `log`.
  std::unique_ptr<LogSource> log;
  std::shared_ptr<Store> store;
  absl::Status none;  // Not OK: no rank coordinates in this term (why); nothing else is set.
};

absl::Status LeaderLink::Usable(const Target& target) {
  if (target.none.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("no fleet coordinator in etcd term ", target.term, ": ",
                                             target.none.message()));
}

std::shared_ptr<const LeaderLink::Target> LeaderLink::Targets::Follow(std::shared_ptr<const Target> target) {
  absl::MutexLock lock(&mu_);
  if (target_ != nullptr) {
    if (target->term < target_->term) return nullptr;
    // The same term again only to switch a remote target to this process's own seat.
    if (target->term == target_->term && (target->seat == nullptr || target_->seat != nullptr)) return nullptr;
  }
  std::shared_ptr<const Target> old = std::move(target_);
  target_ = std::move(target);
  return old;
}

absl::StatusOr<std::shared_ptr<const LeaderLink::Target>> LeaderLink::Targets::Current() const {
  absl::MutexLock lock(&mu_);
  if (target_ == nullptr) return absl::UnavailableError("no fleet coordinator is elected yet (etcd)");
  return target_;
}

void LeaderLink::Follow(int64_t term, int rank, const std::string& address,
                        std::shared_ptr<const CoordinatorSeat> local) {
  auto target = std::make_shared<Target>();
  target->term = term;
  target->rank = rank;
  target->address = address;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      absl::FailedPreconditionError("etcd names a leader key no rank can use");
  if (local == nullptr && rank >= 0) channel = MakeFleetChannel(address, tls_, rank);
  if (local != nullptr) {
    target->seat = local;
    target->log = std::make_unique<LocalLogSource>(local->coordinator.get());
    target->store = local->store;
  } else if (channel.ok()) {
    auto remote = std::make_unique<RemoteLogSource>(*channel);
    target->remote = remote.get();
    target->log = std::move(remote);
    target->store = std::make_shared<GrpcStore>(*channel);
  } else {
    target->none = channel.status();
  }
  // Calls still waiting on the old coordinator (a log read, a report to one that stopped) end
  // now rather than at their deadlines: the caller tries the new one.
  std::shared_ptr<const Target> old = targets_->Follow(std::move(target));
  if (old != nullptr && old->remote != nullptr) old->remote->CancelAll();
}

int64_t LeaderLink::term() const {
  absl::StatusOr<std::shared_ptr<const Target>> target = targets_->Current();
  return target.ok() ? (*target)->term : 0;
}

absl::StatusOr<LogSource::Joined> LeaderLink::FollowingLog::Join(const Member& me) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  ASSIGN_OR_RETURN(Joined joined, target->log->Join(me));
  if (joined.epoch != static_cast<uint64_t>(target->term)) {
    return absl::UnavailableError(absl::StrCat("the coordinator at ", target->address, " answers for epoch ",
                                               joined.epoch, ", not for etcd's term ", target->term));
  }
  return joined;
}

absl::Status LeaderLink::FollowingLog::Leave(int rank, uint64_t incarnation, uint64_t epoch) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  return target->log->Leave(rank, incarnation, epoch);
}

absl::Status LeaderLink::FollowingLog::Report(const ReadyReport& report) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  if (report.epoch != static_cast<uint64_t>(target->term)) {
    return absl::UnavailableError(absl::StrCat("the fleet coordinator changed (etcd term ", target->term, ")"));
  }
  return target->log->Report(report);
}

absl::Status LeaderLink::FollowingLog::Abort(const GroupKey& key, int trainer_rank, const absl::Status& reason,
                                             uint64_t submission, int fleet_rank, uint64_t incarnation) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  return target->log->Abort(key, trainer_rank, reason, submission, fleet_rank, incarnation);
}

absl::StatusOr<std::vector<LogEntry>> LeaderLink::FollowingLog::Read(const ReaderState& reader, int64_t from,
                                                                     absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  if (reader.epoch != static_cast<uint64_t>(target->term)) {
    // Joined an earlier term's coordinator: join the one in force now.
    return absl::FailedPreconditionError(
        absl::StrCat("the fleet coordinator changed: etcd names rank ", target->rank, " (term ", target->term, ")"));
  }
  RETURN_IF_ERROR(Usable(*target));
  return target->log->Read(reader, from, timeout);
}

absl::Status LeaderLink::FollowingStore::Set(absl::string_view key, absl::string_view value) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  return target->store->Set(key, value);
}

absl::StatusOr<std::string> LeaderLink::FollowingStore::Get(absl::string_view key, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  return target->store->Get(key, timeout);
}

absl::StatusOr<int64_t> LeaderLink::FollowingStore::Add(absl::string_view key, int64_t delta) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  return target->store->Add(key, delta);
}

absl::Status LeaderLink::FollowingStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Target> target, targets_->Current());
  RETURN_IF_ERROR(Usable(*target));
  return target->store->Wait(keys, timeout);
}

}  // namespace orthoserve
