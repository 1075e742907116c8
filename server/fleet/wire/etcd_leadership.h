// EtcdLeadership: this rank's part in electing the fleet's coordinator through etcd
// (docs/architecture.md, "Elected coordinator"; flag --membership etcd://...).
//
// Every rank holds an etcd lease, kept alive by a LeaseKeeper, and campaigns in the election
// "<prefix>/coordinator" (etcd's Election service) with "<rank> <fleet address>" as its value.
// The winner coordinates until its lease ends, it resigns, or etcd names another leader. The
// term of a leadership is the create revision of the leader's key: it grows with every leader,
// and the fleet uses it as the coordinator's epoch, so that a member follows one term at a time
// and an old coordinator's answers are refused by every member that knows a newer term.
//
// Every rank follows the election: a Watcher on the election's keys wakes a check at once, and a
// check runs every `check_interval` anyway (the etcd health probe). `on_leader` is called with
// each new leader, this rank included. This rank's leadership starts with `on_elected` and ends
// with `on_deposed`: when etcd says its lease is gone or another key leads, or on Resign/Stop.
//
// What etcd holds is input (etcd_values.h): the key etcd names leader is used only when its value
// names a rank of this fleet (`world`) and a HOST:PORT, and it is on a lease etcd still holds
// (asked once per key and revision). Otherwise no rank coordinates in its term: `on_leader` gets
// rank -1, the key is logged (when first seen, then once a minute while it leads) and counted
// (`on_refused`), and nobody is elected until it is gone (etcd's candidates wait behind it) —
// a key without a lease stays until someone deletes it. Liveness keys that fail their checks
// list nobody, likewise logged and counted.
//
// Liveness keys. With `on_listed` set, every rank also keeps "<prefix>/members/<rank>" =
// "<incarnation> <address>" on a lease of its own (the same TTL, kept alive by its own keeper, so
// campaigns and resignations never touch it), and a thread of its own reads the keys of all
// ranks every `check_interval` and passes them (rank -> incarnation) to `on_listed` (apart from
// the leader checks, which an unreachable etcd's calls on the liveness key would delay): a
// process that dies or stops is unlisted one TTL later, when its lease ends. Stop revokes the
// lease first (the key goes at once, before Stop waits for the campaign thread). Listings start
// (and start again after etcd was unreachable) one TTL after etcd answers, so that a rank whose
// lease lapsed in the outage has put its key again before anyone reads its absence.
//
// When etcd cannot be reached nothing changes: the leader stays leader and followers follow it,
// `reachable()` is false and says since when, and etcd's first answer settles it (the same
// leader goes on; a different one, or none, deposes this rank). A leader whose keep-alives go
// unanswered for a whole TTL keeps its lease id: once etcd answers and still names it, it keeps
// the lease alive again; a lease etcd says is gone (NOT_FOUND) deposes it at once.
//
// Callbacks run on the leadership's threads, one at a time (never two at once), with no lock of
// this class held; they must not call Resign, Stop or the destructor. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/etcd/etcd_client.h"
#include "server/etcd/lease_keeper.h"
#include "server/etcd/watcher.h"
#include "server/fleet/wire/etcd_values.h"

namespace orthoserve {

class EtcdLeadership {
 public:
  struct Options {
    etcd::EtcdOptions etcd;
    std::string prefix;      // The fleet's keys in etcd ("/orthoserve/<fleet>"); the election is prefix + "/coordinator".
    int world = 0;           // The fleet's size (--world): ranks read from etcd must be below it. Required.
    int rank = 0;            // This rank (below `world`),
    std::string address;     // and the fleet address (HOST:PORT) where it serves the fleet service when elected.
    absl::Duration ttl = absl::Seconds(5);                    // The lease's TTL: a dead leader is replaced within it.
    absl::Duration check_interval = absl::ZeroDuration();     // Between checks; zero: ttl / 3.
    // One Campaign call's deadline (then it is made again); zero: the TTL. It bounds Stop, which
    // waits for the call to end.
    absl::Duration campaign_window = absl::ZeroDuration();
    std::function<void(int64_t term)> on_elected;                              // Required.
    std::function<void(int64_t term, const absl::Status& reason)> on_deposed;  // Required.
    // Each new leader, or rank -1 for a term whose leader key this rank cannot use. Required.
    std::function<void(const LeaderInfo& leader)> on_leader;
    uint64_t incarnation = 0;  // This process's fleet incarnation, for its liveness key (non-zero with on_listed).
    // Called after each check that read the liveness keys, with the ranks listed (rank ->
    // incarnation); optional (no liveness keys without it).
    std::function<void(const absl::flat_hash_map<int, uint64_t>& listed)> on_listed;
    // Called when etcd stops answering (with the error and since when) and when it answers
    // again (OK); optional (metrics).
    std::function<void(const absl::Status& status, absl::Time since)> on_reachability;
    // Called once for each value read from etcd that this rank refuses (`what`: "leader" or
    // "member"), however long it stays; optional (metrics).
    std::function<void(absl::string_view what)> on_refused;
  };

  // Connects (lazily), reads the current leader (calling on_leader when there is one) and starts
  // campaigning. INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<EtcdLeadership>> Start(Options options);
  ~EtcdLeadership();  // Stop().

  // Stops campaigning and gives up leadership now (the next candidate leads at once), calling
  // on_deposed if this rank led. Idempotent; bounded by etcd's call timeout.
  void Resign();
  // Resign, then stops following and joins the threads.
  void Stop();

  // The leader last seen (term 0: none seen yet; rank -1: an unusable leader key).
  LeaderInfo leader() const;
  // The term this rank leads (0: none).
  int64_t leading_term() const;
  // Whether etcd answered the last check; when not, since when it has not.
  bool reachable() const;
  absl::Time unreachable_since() const;
  // The last error from etcd (OK while reachable).
  absl::Status etcd_status() const;

 private:
  explicit EtcdLeadership(Options options, std::unique_ptr<etcd::EtcdClient> client);

  void CampaignLoop();
  void MonitorLoop();
  // Reads the leader from etcd and acts on it (on_leader; deposes this rank when another leads).
  void Check();
  // The verdict on leader key `kv` (ParseLeaderKey, then whether etcd still holds its lease),
  // remembered for the key at its mod revision. Returns the error of an etcd call that left it
  // undecided (`verdict` untouched).
  absl::Status Judge(const etcd::KeyValue& kv, absl::StatusOr<LeaderInfo>* verdict) ABSL_LOCKS_EXCLUDED(mu_);
  // Logs the refusal of leader key `kv` (when new, then once a minute); true when it is new.
  bool RefuseLeaderLocked(const etcd::KeyValue& kv, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ranks etcd's liveness keys list (rank -> incarnation), the others logged and counted
  // (lister thread).
  absl::flat_hash_map<int, uint64_t> ListedRanks(const std::vector<etcd::KeyValue>& kvs);
  // Waits until the current leadership ends (resigned: CANCELLED; deposed: why).
  absl::Status HoldLeadership() ABSL_LOCKS_EXCLUDED(mu_);
  // The lease keeper's report of a lost lease.
  void LeaseLost(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void Depose(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EnsureLease() ABSL_LOCKS_EXCLUDED(mu_);
  // The liveness keys' thread (when on_listed is set): KeepListed every check_interval. Apart from
  // the monitor, so that calls to an unreachable etcd (each up to its call timeout) do not delay
  // the leader checks.
  void ListLoop();
  // Keeps this rank's liveness key (a new lease and put when it has none, or its keeper ended),
  // reads every rank's and calls on_listed (lister thread).
  void KeepListed() ABSL_LOCKS_EXCLUDED(mu_);
  void DropLease(bool revoke) ABSL_LOCKS_EXCLUDED(mu_);
  void Reached(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void ReachedLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SleepFor(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);  // False when stopping.

  const Options options_;
  const std::string election_;
  const std::unique_ptr<etcd::EtcdClient> client_;
  absl::Mutex callback_mu_;  // Serializes the callbacks.

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;   // Stop: the threads end.
  bool resigned_ ABSL_GUARDED_BY(mu_) = false;   // Resign: no more campaigns.
  bool check_now_ ABSL_GUARDED_BY(mu_) = false;  // The watcher saw a change.
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration lease_ttl_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<etcd::LeaseKeeper> keeper_ ABSL_GUARDED_BY(mu_);
  // The liveness key's lease and keeper (lister thread, and Stop after it ended).
  int64_t member_lease_ = 0;
  std::unique_ptr<etcd::LeaseKeeper> member_keeper_;
  EtcdRefusals member_refusals_{absl::Minutes(1)};  // Liveness keys refused (lister thread).
  std::optional<etcd::LeaderKey> leading_ ABSL_GUARDED_BY(mu_);  // This rank's leadership.
  absl::Status deposed_ ABSL_GUARDED_BY(mu_);                    // Why it ended, when it ended.
  LeaderInfo leader_ ABSL_GUARDED_BY(mu_);
  // The key etcd names leader, usable or not: the watcher wakes a check when it changes.
  std::string leader_key_ ABSL_GUARDED_BY(mu_);
  // Judge's last verdict, on this key at this mod revision.
  std::string judged_key_ ABSL_GUARDED_BY(mu_);
  int64_t judged_revision_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusOr<LeaderInfo> judged_ ABSL_GUARDED_BY(mu_);
  EtcdRefusals leader_refusals_ ABSL_GUARDED_BY(mu_){absl::Minutes(1)};
  absl::Status etcd_status_ ABSL_GUARDED_BY(mu_);
  absl::Time unreachable_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Since when etcd has answered (start, or its first answer after an outage): listings are
  // passed on only a TTL after it, when every live rank has had time to put its key again.
  absl::Time reachable_since_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::unique_ptr<etcd::Watcher> watcher_;  // Set before the threads start; stopped in Stop.
  std::thread campaign_;
  std::thread monitor_;
  std::thread lister_;
};

}  // namespace orthoserve
