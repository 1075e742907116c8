#include "server/fleet/logic/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace orthoserve {

Membership::Membership(const Options& options) : options_(options), known_(options.fleet_world) {}

bool Membership::IsMember(int rank, uint64_t incarnation) const {
  for (const Member& m : generation_.members) {
    if (m.rank == rank) return m.incarnation == incarnation;
  }
  return false;
}

bool Membership::HomeRankRunsEveryBatch() const {
  for (const Member& m : generation_.members) {
    if (m.rank == options_.home_rank) return generation_.formed;
  }
  return false;
}

absl::Status Membership::CheckReader(int rank, uint64_t incarnation) const {
  if (rank < 0 || rank >= options_.fleet_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet rank ", rank, " is out of range for --world = ", options_.fleet_world));
  }
  const Known& k = known_[rank];
  if (!Reads(k) || k.member.incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("fleet rank ", rank, " is not joined (it was dropped or replaced); join again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Membership::Joined> Membership::Join(const Member& member, int64_t log_end, absl::Time now) {
  if (member.rank < 0 || member.rank >= options_.fleet_world) {
    return absl::InvalidArgumentError(absl::StrCat("fleet rank ", member.rank, " is out of range for the coordinator's --world = ",
                                                   options_.fleet_world, "; every rank needs the same --world"));
  }
  Known& k = known_[member.rank];
  const bool was_joined = k.state == RankState::kJoining || k.state == RankState::kMember;
  Joined joined;
  joined.restarted = was_joined && k.member.incarnation != member.incarnation;
  if (was_joined && !joined.restarted) {
    joined.again = true;
    joined.cursor = k.cursor;
    return joined;
  }
  LOG_INFO("fleet") << "fleet rank " << member.rank << " (" << member.address << ") "
                    << (joined.restarted ? "restarted and joins" : "joins");
  k.state = RankState::kJoining;
  k.member = member;
  k.last_seen = now;
  k.cursor = log_end;
  k.formed_generation = 0;
  k.failed_generation = 0;
  k.listed = false;
  joined.cursor = k.cursor;
  return joined;
}

void Membership::Leave(int rank) {
  LOG_INFO("fleet") << "fleet rank " << rank << " leaves the fleet";
  known_[rank].state = RankState::kLeaving;
}

Membership::Heard Membership::Hear(const ReaderState& reader, int64_t from, absl::Time now) {
  Known& k = known_[reader.rank];
  k.last_seen = now;
  k.cursor = std::max(k.cursor, from);
  if (reader.failed_generation == generation_.number && generation_.number > 0 &&
      k.failed_generation != generation_.number) {
    // Once per generation: a member that cannot join (or lost) this generation's collective
    // makes the next one, without the ranks that are gone by then.
    k.failed_generation = generation_.number;
    if (k.formed_generation != generation_.number && reader.formed_generation != generation_.number) {
      k.failures.push_back(now);  // It never joined this generation's collective.
      join_failed_ = generation_.number;
    }
    LOG_WARNING("fleet") << "fleet rank " << reader.rank << " could not keep generation " << generation_.number
                         << "'s collective; forming the next";
    return Heard::kFailed;
  }
  if (reader.formed_generation == generation_.number && k.formed_generation != generation_.number &&
      k.failed_generation != generation_.number) {
    k.formed_generation = generation_.number;
    bool all = true;
    for (const Member& m : generation_.members) all = all && known_[m.rank].formed_generation == generation_.number;
    if (all && !generation_.formed) {
      generation_.formed = true;
      LOG_INFO("fleet") << "generation " << generation_.number << " formed with " << generation_.members.size()
                        << " of " << options_.fleet_world << " ranks";
      return Heard::kFormed;
    }
  }
  return Heard::kNothing;
}

void Membership::Seen(int rank, absl::Time now) { known_[rank].last_seen = now; }

int64_t Membership::OldestCursor(int64_t log_end) const {
  int64_t oldest = log_end;
  for (const Known& k : known_) {
    if (Reads(k)) oldest = std::min(oldest, k.cursor);
  }
  return oldest;
}

void Membership::Schedule(const std::string& reason, bool force, absl::Time now) {
  const absl::Time at = now + options_.reform_delay;
  if (at < reform_at_ || reform_at_ == absl::InfiniteFuture()) {
    reform_at_ = std::min(reform_at_, at);
    reform_reason_ = reason;
  }
  reform_forced_ = reform_forced_ || force;
}

std::pair<std::string, bool> Membership::TakeScheduled() {
  reform_at_ = absl::InfiniteFuture();
  return {reform_reason_, reform_forced_};
}

bool Membership::CheckLiveness(absl::Time now) {
  bool lost = false;
  for (size_t r = 0; r < known_.size(); ++r) {
    Known& k = known_[r];
    if (!Reads(k) || now - k.last_seen <= options_.peer_timeout) continue;
    if (k.state == RankState::kLeaving) {
      k.state = RankState::kGone;  // Left, and stopped reading: nothing to reform.
      continue;
    }
    LOG_WARNING("fleet") << "fleet rank " << r << " (" << k.member.address << ") has been silent for "
                         << absl::FormatDuration(now - k.last_seen) << "; it is lost";
    k.state = RankState::kGone;
    lost = true;
  }
  return lost;
}

bool Membership::CheckListed(const absl::flat_hash_map<int, uint64_t>& listed) {
  bool lost = false;
  for (size_t r = 0; r < known_.size(); ++r) {
    Known& k = known_[r];
    if (!Reads(k)) continue;
    auto it = listed.find(static_cast<int>(r));
    if (it != listed.end() && it->second == k.member.incarnation) {
      k.listed = true;
      continue;
    }
    if (!k.listed) continue;  // Not listed yet: its key may be on its way.
    if (k.state == RankState::kLeaving) {
      k.state = RankState::kGone;
      continue;
    }
    LOG_WARNING("fleet") << "fleet rank " << r << " (" << k.member.address
                         << ")'s etcd lease ended (its process died or stopped); it is lost";
    k.state = RankState::kGone;
    lost = true;
  }
  return lost;
}

bool Membership::QuarantineWorst(absl::Time now) {
  if (options_.quarantine_after <= 0) return false;
  int live = 0;
  int pick = -1;
  size_t worst_failures = 0;
  for (size_t r = 0; r < known_.size(); ++r) {
    Known& k = known_[r];
    while (!k.failures.empty() && now - k.failures.front() > options_.quarantine_window) k.failures.pop_front();
    if (!(k.state == RankState::kJoining || k.state == RankState::kMember) || now < k.quarantined_until) continue;
    ++live;
    if (k.failures.size() >= static_cast<size_t>(options_.quarantine_after) && k.failures.size() >= worst_failures) {
      pick = static_cast<int>(r);  // Ties go to the highest rank.
      worst_failures = k.failures.size();
    }
  }
  // A rank taken back by a generation that then failed to form goes straight back out.
  bool again = false;
  if (join_failed_ == generation_.number && generation_.number > 0) {
    for (const Member& m : generation_.members) {
      const Known& k = known_[m.rank];
      if (k.probation == generation_.number && k.member.incarnation == m.incarnation && now >= k.quarantined_until) {
        pick = m.rank;
        again = true;
      }
    }
  }
  if (pick < 0 || live < 2) return false;
  Known& k = known_[pick];
  const size_t failures = k.failures.size();
  // A rank that stayed out of trouble for quarantine_max since its last quarantine starts over.
  const bool fresh = k.backoff == absl::ZeroDuration() || now - k.quarantined_until > options_.quarantine_max;
  k.backoff = fresh ? options_.quarantine_base : std::min(2 * k.backoff, options_.quarantine_max);
  k.quarantined_until = now + k.backoff;
  k.released = false;
  k.returning = true;
  for (Known& other : known_) other.failures.clear();  // Explained by this one; counts start over.
  ++quarantines_;
  last_quarantined_ = pick;
  LOG_WARNING("fleet") << "fleet rank " << pick << " (" << k.member.address << ") keeps failing to join the fleet's "
                       << "collective ("
                       << (again ? std::string("again, in the generation that took it back")
                                 : absl::StrCat(failures, " generations within ",
                                                absl::FormatDuration(options_.quarantine_window)))
                       << "); the next generation goes without it for " << absl::FormatDuration(k.backoff);
  return true;
}

bool Membership::QuarantineOver(absl::Time now) {
  bool over = false;
  for (Known& k : known_) {
    if (k.released || now < k.quarantined_until) continue;
    k.released = true;
    if (k.state != RankState::kJoining && k.state != RankState::kMember) continue;
    LOG_INFO("fleet") << "fleet rank " << k.member.rank << "'s quarantine is over; the next generation takes it back";
    over = true;
  }
  return over;
}

std::vector<int> Membership::Quarantined(absl::Time now) const {
  std::vector<int> out;
  for (size_t r = 0; r < known_.size(); ++r) {
    if (now < known_[r].quarantined_until) out.push_back(static_cast<int>(r));
  }
  return out;
}

bool Membership::Reform(const std::string& reason, bool force, absl::Time now) {
  QuarantineWorst(now);
  std::vector<Member> members;
  for (const Known& k : known_) {
    if ((k.state == RankState::kJoining || k.state == RankState::kMember) && now >= k.quarantined_until) {
      members.push_back(k.member);
    }
  }
  force = force || reform_forced_;
  if (members == generation_.members && !force) return false;
  reform_forced_ = false;
  if (reform_at_ != absl::InfiniteFuture() && members != generation_.members) {
    // This reform includes what a scheduled one would have done.
    reform_at_ = absl::InfiniteFuture();
  }
  ++generation_.number;
  generation_.members = std::move(members);
  generation_.formed = generation_.members.empty();
  for (const Member& m : generation_.members) {
    Known& k = known_[m.rank];
    k.state = RankState::kMember;
    if (k.returning) {  // Taken back after a quarantine: on probation in this generation.
      k.returning = false;
      k.probation = generation_.number;
    }
  }
  // A quarantined rank stays joined (it reads the log) but is no member until it is taken back.
  LOG_INFO("fleet") << "generation " << generation_.number << " (" << reason << "): " << generation_.members.size()
                    << " of " << options_.fleet_world << " ranks";
  return true;
}

}  // namespace orthoserve
