// Membership half of server/fleet/logic/coordinator.h: joins, graceful leaves, liveness and the
// generations they start.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/fleet/logic/coordinator.h"

namespace orthoserve {

bool Coordinator::IsMemberLocked(int rank, uint64_t incarnation) const {
  for (const Member& m : generation_.members) {
    if (m.rank == rank) return m.incarnation == incarnation;
  }
  return false;
}

absl::Status Coordinator::CheckIdentityLocked(int rank, uint64_t epoch, uint64_t incarnation) const {
  if (epoch != epoch_) {
    return absl::FailedPreconditionError("the fleet coordinator restarted since this rank joined; join again");
  }
  if (rank < 0 || rank >= options_.fleet_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet rank ", rank, " is out of range for --world = ", options_.fleet_world));
  }
  const Known& k = known_[rank];
  const bool reading = k.state == RankState::kJoining || k.state == RankState::kMember || k.state == RankState::kLeaving;
  if (!reading || k.member.incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("fleet rank ", rank, " is not joined (it was dropped or replaced); join again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Coordinator::Join(const Member& member) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down; retry");
  if (member.rank < 0 || member.rank >= options_.fleet_world) {
    return absl::InvalidArgumentError(absl::StrCat("fleet rank ", member.rank, " is out of range for the coordinator's --world = ",
                                                   options_.fleet_world, "; every rank needs the same --world"));
  }
  Known& k = known_[member.rank];
  const bool was_joined = k.state == RankState::kJoining || k.state == RankState::kMember;
  const bool restarted = was_joined && k.member.incarnation != member.incarnation;
  if (was_joined && !restarted) {
    // The same process joining again (its reply was lost): nothing changes.
    return k.cursor;
  }
  LOG_INFO("fleet") << "fleet rank " << member.rank << " (" << member.address << ") "
                    << (restarted ? "restarted and joins" : "joins");
  k.state = RankState::kJoining;
  k.member = member;
  k.last_seen = absl::Now();
  k.cursor = first_index_ + static_cast<int64_t>(log_.size());
  k.formed_generation = 0;
  k.failed_generation = 0;
  if (restarted) {
    // Its previous process is gone: whatever it held is lost now, not at the next reform.
    ReformLocked("restarted", /*force=*/false);
  }
  ScheduleReformLocked(restarted ? "restarted" : "joined", /*force=*/false);
  return k.cursor;
}

absl::Status Coordinator::Leave(int rank, uint64_t incarnation, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the fleet coordinator is shutting down");
  RETURN_IF_ERROR(CheckIdentityLocked(rank, epoch, incarnation));
  LOG_INFO("fleet") << "fleet rank " << rank << " leaves the fleet";
  // Out of the membership, but it keeps reading until it has seen the generation without it.
  known_[rank].state = RankState::kLeaving;
  ReformLocked("left", /*force=*/false);
  return absl::OkStatus();
}

void Coordinator::ScheduleReformLocked(const std::string& reason, bool force) {
  const absl::Time at = absl::Now() + options_.reform_delay;
  if (at < reform_at_ || reform_at_ == absl::InfiniteFuture()) {
    reform_at_ = std::min(reform_at_, at);
    reform_reason_ = reason;
  }
  reform_forced_ = reform_forced_ || force;
  timer_cv_.SignalAll();
}

void Coordinator::CheckLivenessLocked(absl::Time now) {
  bool lost = false;
  for (size_t r = 0; r < known_.size(); ++r) {
    Known& k = known_[r];
    if (k.state != RankState::kJoining && k.state != RankState::kMember && k.state != RankState::kLeaving) continue;
    if (now - k.last_seen <= options_.peer_timeout) continue;
    if (k.state == RankState::kLeaving) {
      k.state = RankState::kGone;  // Left, and stopped reading: nothing to reform.
      continue;
    }
    LOG_WARNING("fleet") << "fleet rank " << r << " (" << k.member.address << ") has been silent for "
                         << absl::FormatDuration(now - k.last_seen) << "; it is lost";
    k.state = RankState::kGone;
    lost = true;
  }
  if (lost) ReformLocked("lost", /*force=*/false);
}

void Coordinator::ReformLocked(const std::string& reason, bool force) {
  std::vector<Member> members;
  for (const Known& k : known_) {
    if (k.state == RankState::kJoining || k.state == RankState::kMember) members.push_back(k.member);
  }
  force = force || reform_forced_;
  if (members == generation_.members && !force) return;
  reform_forced_ = false;
  if (reform_at_ != absl::InfiniteFuture() && members != generation_.members) {
    // This reform includes what a scheduled one would have done.
    reform_at_ = absl::InfiniteFuture();
  }
  ++generation_.number;
  generation_.members = members;
  generation_.formed = members.empty();
  for (const Member& m : members) known_[m.rank].state = RankState::kMember;
  LOG_INFO("fleet") << "generation " << generation_.number << " (" << reason << "): " << members.size() << " of "
                    << options_.fleet_world << " ranks";
  if (!members.empty()) {
    LogEntry entry;
    entry.generation = generation_.number;
    entry.members = members;
    entry.graceful = reason == "left" || reason == "joined";
    AppendLocked(std::move(entry));
  }
  // Reports held by ranks that are no longer members cannot take part: withdraw them (their
  // streams fail, and the trainers retry on a member).
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    std::vector<int> gone;
    for (const auto& [r, held] : p.reports) {
      if (!IsMemberLocked(held.report.fleet_rank, held.report.incarnation)) gone.push_back(r);
    }
    for (int r : gone) WithdrawLocked(p, r);
    if (p.arrived() == 0) {
      ErasePendingLocked(it++);
    } else {
      ++it;
    }
  }
  // Ranks that keep a replay's inputs may have become members just now.
  std::vector<GroupKey> replays;
  for (const auto& [key, p] : pending_) {
    auto k = kept_.find(key.Group());
    if (k != kept_.end() && k->second.key == key) replays.push_back(key);
  }
  for (const GroupKey& key : replays) FillReplayLocked(key);
  // The new generation is not formed yet, so nothing is paced: queued steps go into the log now
  // (placed on the new members), and batches of the old generation hold nothing back.
  unran_.clear();
  ReleaseLocked();
  if (options_.on_generation) options_.on_generation(generation_, reason);
}

Generation Coordinator::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace orthoserve
