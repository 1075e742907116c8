// Which rank processes the fleet has, and the generation in force: the membership part of the
// coordinator (coordinator.h, "Membership"). It decides who is a member; the coordinator puts
// each new generation into the log and settles what it changes for pending steps. Not
// thread-safe: the coordinator's lock guards it.
//
// Quarantine. A rank that keeps failing to join its generation's collective
// (`quarantine_after` generations within `quarantine_window`) would otherwise have the same
// generation formed again and again forever — a partial partition (one rank's collective port
// refused by one peer) is the case. When the next generation is formed, the worst such rank (the
// most failures in the window; ties to the highest rank) is left out of it for a backoff that
// doubles with each quarantine (`quarantine_base` up to `quarantine_max`; it starts over for a
// rank that stayed out of trouble for `quarantine_max`), so the others form a smaller working
// generation. One rank at a time, and never the last live one. A quarantined rank keeps reading
// the log (it is alive) and serves its lone clients; when its time is up the next generation
// takes it back, and if that generation then fails to form, it goes straight back out for
// twice as long. Only failures to join count (a rank that formed its generation and then lost
// the collective was most likely let down by a peer that died, which the peer timeout handles),
// and each is the rank's own report: both ends of a broken pair report, which is why only the
// worst goes, and every count starts over after each quarantine.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/fleet/logic/fleet_log.h"

namespace orthoserve {

class Membership {
 public:
  struct Options {
    int fleet_world = 1;                                    // S: ranks are 0..S-1.
    absl::Duration peer_timeout = absl::Seconds(15);        // A rank silent this long is lost.
    absl::Duration reform_delay = absl::Milliseconds(200);  // Joins within this time form one generation.
    // Quarantine (above): failures in distinct generations within the window that make a rank a
    // candidate (0: never quarantine), and the backoff's first and largest length.
    int quarantine_after = 3;
    absl::Duration quarantine_window = absl::Seconds(60);
    absl::Duration quarantine_base = absl::Seconds(10);
    absl::Duration quarantine_max = absl::Minutes(5);
    int home_rank = 0;  // The coordinator's own rank (HomeRankRunsEveryBatch).
  };
  explicit Membership(const Options& options);

  const Generation& generation() const { return generation_; }
  // A member of the current generation with this rank and incarnation.
  bool IsMember(int rank, uint64_t incarnation) const;
  // The home rank (the coordinator's own process; rank 0 of a static fleet) is a member of the
  // generation and the generation is formed: only then does its executor report every batch it
  // ran (the coordinator's pacing depends on it).
  bool HomeRankRunsEveryBatch() const;

  // OK when rank `rank` of `incarnation` reads the log (it joined and is a member, or is leaving);
  // INVALID_ARGUMENT for a rank out of range, FAILED_PRECONDITION when it must join again.
  absl::Status CheckReader(int rank, uint64_t incarnation) const;

  struct Joined {
    int64_t cursor = 0;      // Where it reads from.
    bool restarted = false;  // A new incarnation of a joined rank: its previous process is gone.
    bool again = false;      // The same process joining again (its reply was lost): nothing changed.
  };
  // Registers a rank process that reads from `log_end`. INVALID_ARGUMENT for a rank outside [0, S).
  absl::StatusOr<Joined> Join(const Member& member, int64_t log_end, absl::Time now);
  // A graceful leave of a reader (CheckReader passed): out of the membership, but it keeps reading
  // until it has seen the generation without it.
  void Leave(int rank);

  // What a reader's formation report changes.
  enum class Heard {
    kNothing,
    kFailed,  // It could not join (or lost) the current generation's collective: form the next.
    kFormed,  // Its report made every member joined: the generation is formed now.
  };
  // A read of `reader` from index `from` at `now`: its heartbeat, its cursor and its formation
  // report (each reported once per generation).
  Heard Hear(const ReaderState& reader, int64_t from, absl::Time now);
  // A reader's heartbeat alone (at the end of its read).
  void Seen(int rank, absl::Time now);
  // The lowest index a joined rank will still read (log_end when none).
  int64_t OldestCursor(int64_t log_end) const;

  // Asks for a reform after `reform_delay` (joins and failures that come together make one).
  void Schedule(const std::string& reason, bool force, absl::Time now);
  // When the scheduled reform is due (InfiniteFuture: none).
  absl::Time reform_at() const { return reform_at_; }
  // The scheduled reform's reason and whether it is forced; clears the schedule.
  std::pair<std::string, bool> TakeScheduled();
  // Marks ranks silent for longer than the peer timeout lost (a leaving rank just gone); true
  // when a member was lost.
  bool CheckLiveness(absl::Time now);
  // The ranks whose liveness keys etcd lists (rank -> incarnation; --membership etcd://): a
  // rank that joined and was listed with its incarnation, and is not any more (its lease ended:
  // the process died or stopped for the lease TTL), is lost now, without waiting for the peer
  // timeout. A rank not yet listed is left to the peer timeout. True when a member was lost.
  bool CheckListed(const absl::flat_hash_map<int, uint64_t>& listed);
  // Starts the next generation when the live ranks differ from the members (or `force`, or a
  // scheduled forced reform); true when it did. First quarantines the worst rank that has
  // failed too often (above), so that generation goes without it.
  bool Reform(const std::string& reason, bool force, absl::Time now);

  // True when a live rank's quarantine ended by `now`: the next generation may take it back.
  bool QuarantineOver(absl::Time now);
  // Ranks in quarantine at `now`, in rank order.
  std::vector<int> Quarantined(absl::Time now) const;
  // Quarantines started so far, and the rank of the last.
  int64_t quarantines() const { return quarantines_; }
  int last_quarantined() const { return last_quarantined_; }

 private:
  // kLeaving: left gracefully, not a member, but still reads until it sees the generation
  // without it.
  enum class RankState { kAbsent, kJoining, kMember, kLeaving, kGone };
  struct Known {
    RankState state = RankState::kAbsent;
    Member member;
    absl::Time last_seen;
    int64_t cursor = 0;             // Next index it will read.
    int64_t formed_generation = 0;  // Last generation it reported joined.
    int64_t failed_generation = 0;  // Last generation it reported failed.
    std::deque<absl::Time> failures;  // When it failed to join a generation (within the window).
    absl::Time quarantined_until = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();  // Its last quarantine's length (0: none yet).
    bool released = true;    // The end of its last quarantine was announced (QuarantineOver).
    bool returning = false;  // Quarantined, and not yet in a generation since.
    int64_t probation = 0;   // The generation that took it back after its last quarantine.
    bool listed = false;     // etcd has listed this incarnation's liveness key (CheckListed).
  };
  // Leaves the worst candidate out of the next generation (see "Quarantine"); true if it did.
  bool QuarantineWorst(absl::Time now);
  static bool Reads(const Known& k) {
    return k.state == RankState::kJoining || k.state == RankState::kMember || k.state == RankState::kLeaving;
  }

  const Options options_;
  std::vector<Known> known_;  // By rank.
  Generation generation_;
  absl::Time reform_at_ = absl::InfiniteFuture();  // A delayed reform (after joins).
  std::string reform_reason_;
  bool reform_forced_ = false;  // The next reform happens even with unchanged members.
  int64_t join_failed_ = 0;     // The last generation a member failed to join.
  int64_t quarantines_ = 0;
  int last_quarantined_ = -1;
};

}  // namespace orthoserve
