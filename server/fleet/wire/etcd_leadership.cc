// Implementation of server/fleet/wire/etcd_leadership.h.
#include "server/fleet/wire/etcd_leadership.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/fleet/logic/address.h"

namespace orthoserve {

absl::StatusOr<std::unique_ptr<EtcdLeadership>> EtcdLeadership::Start(Options options) {
  if (options.prefix.empty() || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("the fleet's etcd prefix \"", options.prefix, "\" must be non-empty and not end with /"));
  }
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("EtcdLeadership: rank ", options.rank, " is outside a fleet of ", options.world, " ranks"));
  }
  if (absl::Status address = CheckHostPort(options.address); !address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("EtcdLeadership: this rank's fleet address \"", options.address,
                                                   "\" is one no rank would follow: ", address.message()));
  }
  if (options.on_listed && options.incarnation == 0) {
    return absl::InvalidArgumentError("EtcdLeadership: a liveness key needs a non-zero incarnation");
  }
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("the fleet's etcd lease TTL ", absl::FormatDuration(options.ttl),
                                                   " is under etcd's minimum of 1 s"));
  }
  if (!options.on_elected || !options.on_deposed || !options.on_leader) {
    return absl::InvalidArgumentError("EtcdLeadership needs on_elected, on_deposed and on_leader");
  }
  if (options.check_interval <= absl::ZeroDuration()) options.check_interval = options.ttl / 3;
  if (options.campaign_window <= absl::ZeroDuration()) options.campaign_window = options.ttl;
  ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> client, etcd::EtcdClient::Create(options.etcd));
  std::unique_ptr<EtcdLeadership> leadership(new EtcdLeadership(std::move(options), std::move(client)));
  leadership->Check();  // The leader as it is, when etcd answers.
  {
    absl::MutexLock lock(&leadership->mu_);
    leadership->check_now_ = true;  // The monitor starts its watch at once.
  }
  leadership->monitor_ = std::thread([l = leadership.get()] { l->MonitorLoop(); });
  leadership->campaign_ = std::thread([l = leadership.get()] { l->CampaignLoop(); });
  if (leadership->options_.on_listed) {
    leadership->lister_ = std::thread([l = leadership.get()] { l->ListLoop(); });
  }
  return leadership;
}

EtcdLeadership::EtcdLeadership(Options options, std::unique_ptr<etcd::EtcdClient> client)
    : options_(std::move(options)), election_(options_.prefix + "/coordinator"), client_(std::move(client)) {}

EtcdLeadership::~EtcdLeadership() { Stop(); }

LeaderInfo EtcdLeadership::leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

int64_t EtcdLeadership::leading_term() const {
  absl::MutexLock lock(&mu_);
  return leading_.has_value() && deposed_.ok() ? leading_->revision : 0;
}

bool EtcdLeadership::reachable() const {
  absl::MutexLock lock(&mu_);
  return etcd_status_.ok();
}

absl::Time EtcdLeadership::unreachable_since() const {
  absl::MutexLock lock(&mu_);
  return unreachable_since_;
}

absl::Status EtcdLeadership::etcd_status() const {
  absl::MutexLock lock(&mu_);
  return etcd_status_;
}

void EtcdLeadership::Reached(const absl::Status& status) {
  bool changed;
  absl::Time since;
  {
    absl::MutexLock lock(&mu_);
    changed = status.ok() != etcd_status_.ok();
    ReachedLocked(status);
    since = unreachable_since_;
  }
  if (changed && options_.on_reachability) options_.on_reachability(status, since);
}

void EtcdLeadership::ReachedLocked(const absl::Status& status) {
  if (status.ok()) {
    if (!etcd_status_.ok()) {
      LOG_INFO("fleet") << "etcd answers again after " << absl::FormatDuration(absl::Now() - unreachable_since_);
      reachable_since_ = absl::Now();
    }
    unreachable_since_ = absl::InfiniteFuture();
  } else if (etcd_status_.ok()) {
    unreachable_since_ = absl::Now();
    LOG_WARNING("fleet") << "etcd is unreachable (" << status.message()
                         << "): the fleet goes on with the coordinator it has (no election can happen) until it "
                            "answers again";
  }
  etcd_status_ = status;
}

bool EtcdLeadership::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || resigned_; };
  mu_.AwaitWithTimeout(absl::Condition(&done), d);
  return !(stopping_ || resigned_);
}

absl::Status EtcdLeadership::EnsureLease() {
  {
    absl::MutexLock lock(&mu_);
    if (lease_ != 0) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(etcd::Lease lease, client_->GrantLease(options_.ttl));
  etcd::LeaseKeeper::Options k;
  k.lease_id = lease.id;
  k.ttl = absl::Seconds(lease.ttl_seconds);
  k.on_lost = [this](const absl::Status& status) { LeaseLost(status); };
  ASSIGN_OR_RETURN(std::unique_ptr<etcd::LeaseKeeper> keeper, etcd::LeaseKeeper::Start(&client_->pool(), k));
  absl::MutexLock lock(&mu_);
  lease_ = lease.id;
  lease_ttl_ = k.ttl;
  keeper_ = std::move(keeper);
  return absl::OkStatus();
}

void EtcdLeadership::DropLease(bool revoke) {
  std::unique_ptr<etcd::LeaseKeeper> keeper;
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    keeper = std::move(keeper_);
    lease = lease_;
    lease_ = 0;
  }
  keeper.reset();  // Joins its thread (outside mu_: its on_lost takes mu_).
  if (revoke && lease != 0) {
    absl::Status revoked = client_->RevokeLease(lease);
    if (!revoked.ok() && !absl::IsNotFound(revoked)) {
      VLOG("fleet", 1) << "revoking the fleet lease " << lease << ": " << revoked << " (it expires with its TTL)";
    }
  }
}

void EtcdLeadership::LeaseLost(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  // etcd says the lease is gone: this rank leads no more. Unanswered keep-alives prove nothing
  // (etcd may be unreachable for everyone): the monitor's next answer from etcd decides.
  if (absl::IsNotFound(status) && leading_.has_value() && deposed_.ok()) {
    deposed_ = absl::FailedPreconditionError(absl::StrCat("the fleet coordinator's etcd lease is gone: ", status.message()));
  }
  check_now_ = true;  // Wakes the monitor.
}

absl::Status EtcdLeadership::Judge(const etcd::KeyValue& kv, absl::StatusOr<LeaderInfo>* verdict) {
  {
    absl::MutexLock lock(&mu_);
    if (!judged_key_.empty() && judged_key_ == kv.key && judged_revision_ == kv.mod_revision) {
      *verdict = judged_;
      return absl::OkStatus();
    }
  }
  absl::StatusOr<LeaderInfo> v = ParseLeaderKey(kv, options_.world);
  if (v.ok()) {
    // etcd deletes a lease's keys with it; a key seen after its lease ended is on its way out.
    absl::StatusOr<absl::Duration> left = client_->LeaseTimeToLive(kv.lease);
    if (absl::IsNotFound(left.status())) {
      v = absl::FailedPreconditionError(
          absl::StrCat("the fleet's leader key ", kv.key, " is on lease ", kv.lease, ", which etcd no longer holds"));
    } else if (!left.ok()) {
      return left.status();
    }
  }
  absl::MutexLock lock(&mu_);
  judged_key_ = kv.key;
  judged_revision_ = kv.mod_revision;
  judged_ = v;
  *verdict = std::move(v);
  return absl::OkStatus();
}

bool EtcdLeadership::RefuseLeaderLocked(const etcd::KeyValue& kv, const absl::Status& why) {
  leader_refusals_.Retain({kv.key});
  const EtcdRefusals::Seen seen = leader_refusals_.Refuse(kv, absl::Now());
  if (seen != EtcdRefusals::Seen::kQuiet) {
    LOG_WARNING("fleet") << "etcd names a fleet coordinator this rank cannot use (term " << kv.create_revision
                         << (seen == EtcdRefusals::Seen::kAgain ? ", still" : "") << "): " << why.message()
                         << ". No rank coordinates until etcd names another leader; the candidates wait behind this "
                            "key, and one that no rank of this fleet wrote stays until it is deleted (etcdctl del "
                         << absl::CHexEscape(kv.key) << ")";
  }
  return seen == EtcdRefusals::Seen::kNew;
}

void EtcdLeadership::Check() {
  absl::StatusOr<etcd::KeyValue> kv = client_->Leader(election_);
  if (!kv.ok() && !absl::IsNotFound(kv.status())) {
    Reached(kv.status());
    return;
  }
  absl::StatusOr<LeaderInfo> verdict = absl::NotFoundError("etcd names no leader");
  if (kv.ok()) {
    if (absl::Status judged = Judge(*kv, &verdict); !judged.ok()) {
      Reached(judged);
      return;
    }
  }
  Reached(absl::OkStatus());
  absl::MutexLock callbacks(&callback_mu_);
  std::optional<LeaderInfo> changed;
  bool restart_keeper = false;
  bool refused = false;
  {
    absl::MutexLock lock(&mu_);
    if (kv.ok()) {
      if (kv->create_revision >= leader_.term) leader_key_ = kv->key;
      if (!verdict.ok()) refused = RefuseLeaderLocked(*kv, verdict.status());
      // An unusable leader key is no leader: nobody coordinates in its term.
      const LeaderInfo named = verdict.ok() ? *verdict : LeaderInfo{kv->create_revision, -1, ""};
      if (named.term > leader_.term) {
        leader_ = named;
        changed = named;
      }
      if (leading_.has_value() && deposed_.ok()) {
        if (kv->key != leading_->key) {
          deposed_ = absl::FailedPreconditionError(
              absl::StrCat("etcd names another fleet coordinator (term ", kv->create_revision, ")"));
        } else if (keeper_ != nullptr && !keeper_->status().ok() && !absl::IsNotFound(keeper_->status())) {
          // Keep-alives went unanswered, but etcd still names this rank: its lease lives.
          restart_keeper = true;
        }
      }
    } else if (leading_.has_value() && deposed_.ok()) {
      deposed_ = absl::FailedPreconditionError("etcd names no fleet coordinator: this rank's leader key is gone");
    }
  }
  if (refused && options_.on_refused) options_.on_refused("leader");
  if (restart_keeper) {
    std::unique_ptr<etcd::LeaseKeeper> old;
    etcd::LeaseKeeper::Options k;
    {
      absl::MutexLock lock(&mu_);
      old = std::move(keeper_);
      k.lease_id = lease_;
      k.ttl = lease_ttl_;
    }
    old.reset();
    k.on_lost = [this](const absl::Status& status) { LeaseLost(status); };
    absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper = etcd::LeaseKeeper::Start(&client_->pool(), k);
    absl::MutexLock lock(&mu_);
    if (keeper.ok()) {
      LOG_INFO("fleet") << "etcd still names this rank the fleet coordinator: keeping its lease alive again";
      keeper_ = std::move(*keeper);
    } else {
      deposed_ = keeper.status();
    }
  }
  if (changed.has_value()) options_.on_leader(*changed);
}

void EtcdLeadership::MonitorLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || check_now_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), options_.check_interval);
      if (stopping_) return;
      check_now_ = false;
    }
    // A watch on the election's keys makes a change of leader seen at once; without one (etcd
    // was unreachable, or the watch ended) the periodic check alone follows it.
    if (watcher_ == nullptr || !watcher_->status().ok()) {
      watcher_.reset();
      etcd::Watcher::Options w;
      w.prefix = election_ + "/";
      w.on_events = [this](const std::vector<etcd::WatchEvent>& events) {
        absl::MutexLock lock(&mu_);
        for (const etcd::WatchEvent& e : events) {
          // Candidates come and go (each campaign window); only the leader's key matters (its
          // deletion hands leadership on), or any key while no leader is known.
          if (leader_key_.empty() || e.key == leader_key_) {
            check_now_ = true;
          }
        }
      };
      absl::StatusOr<std::unique_ptr<etcd::Watcher>> watcher = etcd::Watcher::Start(&client_->pool(), w);
      if (watcher.ok()) watcher_ = std::move(*watcher);
    }
    Check();
  }
}

void EtcdLeadership::ListLoop() {
  for (;;) {
    KeepListed();
    absl::MutexLock lock(&mu_);
    // Until Stop, not Resign: a rank that resigned is still a member until it leaves.
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.check_interval);
    if (stopping_) return;
  }
}

void EtcdLeadership::KeepListed() {
  const std::string members = options_.prefix + "/members/";
  if (member_keeper_ != nullptr && !member_keeper_->status().ok()) {
    // Lost (NOT_FOUND) or unanswered: a new lease, and the key put again on it (the old lease,
    // if it lives, deletes nothing when it ends: the key is no longer on it).
    member_keeper_.reset();
    member_lease_ = 0;
  }
  if (member_lease_ == 0) {
    absl::StatusOr<etcd::Lease> lease = client_->GrantLease(options_.ttl);
    if (!lease.ok()) return;  // The next check tries again.
    absl::StatusOr<int64_t> put = client_->Put(members + std::to_string(options_.rank),
                                               MemberValue(options_.incarnation, options_.address), lease->id);
    etcd::LeaseKeeper::Options k;
    k.lease_id = lease->id;
    k.ttl = absl::Seconds(lease->ttl_seconds);
    absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper =
        put.ok() ? etcd::LeaseKeeper::Start(&client_->pool(), k) : put.status();
    if (!keeper.ok()) {
      (void)client_->RevokeLease(lease->id);
      VLOG("fleet", 1) << "keeping this rank's etcd liveness key: " << keeper.status();
      return;
    }
    member_lease_ = lease->id;
    member_keeper_ = std::move(*keeper);
  }
  {
    absl::MutexLock lock(&mu_);
    if (!etcd_status_.ok() || absl::Now() - reachable_since_ < options_.ttl) return;
  }
  absl::StatusOr<etcd::RangeResult> listed = client_->GetPrefix(members);
  if (!listed.ok()) return;
  const absl::flat_hash_map<int, uint64_t> ranks = ListedRanks(listed->kvs);
  absl::MutexLock callbacks(&callback_mu_);
  options_.on_listed(ranks);
}

absl::flat_hash_map<int, uint64_t> EtcdLeadership::ListedRanks(const std::vector<etcd::KeyValue>& kvs) {
  // Refusals logged per listing, at most; the rest are summed up in one line.
  constexpr int kLogged = 4;
  const std::string members = options_.prefix + "/members/";
  const absl::Time now = absl::Now();
  absl::flat_hash_map<int, uint64_t> ranks;
  absl::flat_hash_set<std::string> present;
  int logged = 0, unlogged = 0;
  for (const etcd::KeyValue& kv : kvs) {
    absl::StatusOr<ListedMember> member = ParseMemberKey(kv, members, options_.world);
    if (member.ok()) {
      ranks[member->rank] = member->incarnation;
      continue;
    }
    present.insert(kv.key);
    const EtcdRefusals::Seen seen = member_refusals_.Refuse(kv, now);
    if (seen == EtcdRefusals::Seen::kNew && options_.on_refused) options_.on_refused("member");
    if (seen == EtcdRefusals::Seen::kQuiet) continue;
    if (logged++ < kLogged) {
      LOG_WARNING("fleet") << member.status().message() << "; it lists no rank"
                           << (seen == EtcdRefusals::Seen::kAgain ? " (still there)" : "");
    } else {
      ++unlogged;
    }
  }
  if (unlogged > 0) LOG_WARNING("fleet") << "and " << unlogged << " more etcd keys that list no rank";
  member_refusals_.Retain(present);
  return ranks;
}

absl::Status EtcdLeadership::HoldLeadership() {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || resigned_ || !deposed_.ok(); };
  mu_.Await(absl::Condition(&ended));
  if (stopping_ || resigned_) return absl::CancelledError("this rank resigned as the fleet coordinator");
  return deposed_;
}

void EtcdLeadership::CampaignLoop() {
  const std::string value = LeaderValue(options_.rank, options_.address);
  absl::Duration backoff = absl::Milliseconds(100);
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || resigned_) break;
    }
    if (absl::Status lease = EnsureLease(); !lease.ok()) {
      Reached(lease);
      if (!SleepFor(backoff)) break;
      backoff = std::min(2 * backoff, absl::Seconds(1));
      continue;
    }
    int64_t lease;
    {
      absl::MutexLock lock(&mu_);
      lease = lease_;
      if (keeper_ != nullptr && !keeper_->status().ok()) {
        lease = 0;  // Lost while waiting: take a new one.
      }
    }
    if (lease == 0) {
      DropLease(/*revoke=*/false);
      continue;
    }
    absl::StatusOr<etcd::LeaderKey> won =
        client_->Campaign(election_, lease, value, absl::Now() + options_.campaign_window);
    if (!won.ok()) {
      if (absl::IsNotFound(won.status())) {
        DropLease(/*revoke=*/false);  // The lease is gone.
      } else if (!absl::IsDeadlineExceeded(won.status())) {
        Reached(won.status());
        if (!SleepFor(backoff)) break;
        backoff = std::min(2 * backoff, absl::Seconds(1));
      }
      continue;
    }
    backoff = absl::Milliseconds(100);
    // etcd's campaign returns once every earlier candidate is gone, even if this candidacy lapsed
    // meanwhile: lead only if etcd names this key now.
    absl::StatusOr<etcd::KeyValue> leader = client_->Leader(election_);
    if (!leader.ok() || leader->key != won->key) continue;
    bool ending;
    {
      absl::MutexLock lock(&mu_);
      ending = stopping_ || resigned_;
      if (!ending) {
        leading_ = *won;
        deposed_ = absl::OkStatus();
      }
    }
    if (ending) {
      (void)client_->Resign(*won);
      break;
    }
    LOG_INFO("fleet") << "rank " << options_.rank << " is the fleet coordinator (etcd term " << won->revision << ")";
    {
      absl::MutexLock callbacks(&callback_mu_);
      options_.on_elected(won->revision);
    }
    Check();  // on_leader for this term.
    const absl::Status why = HoldLeadership();
    LOG_INFO("fleet") << "rank " << options_.rank << " no longer coordinates the fleet (term " << won->revision
                      << "): " << why.message();
    {
      absl::MutexLock callbacks(&callback_mu_);
      options_.on_deposed(won->revision, why);
    }
    // Resigned: the next candidate leads as soon as the key is gone. Deposed: a new lease and
    // campaign (the old lease may still hold a stale candidacy).
    if (absl::IsCancelled(why)) {
      absl::Status resigned = client_->Resign(*won);
      if (!resigned.ok()) LOG_WARNING("fleet") << "resigning as the fleet coordinator: " << resigned;
    }
    {
      absl::MutexLock lock(&mu_);
      leading_.reset();
    }
    DropLease(/*revoke=*/true);
  }
  absl::MutexLock lock(&mu_);
  leading_.reset();
}

void EtcdLeadership::Resign() {
  {
    absl::MutexLock lock(&mu_);
    if (resigned_) return;
    resigned_ = true;
    // A leader resigns on the campaign thread (on_deposed, then the key); wait for it, within
    // etcd's call timeout.
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !leading_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&done), client_->options().call_timeout + absl::Seconds(1));
  }
  // A candidate's key goes with its lease, so that etcd cannot name it next; its Campaign call
  // ends with its window.
  DropLease(/*revoke=*/true);
}

void EtcdLeadership::Stop() {
  Resign();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // The liveness key first: it goes now, not a TTL later, nor after the campaign thread's call
  // ends (up to campaign_window).
  if (lister_.joinable()) lister_.join();
  member_keeper_.reset();
  if (member_lease_ != 0) {
    (void)client_->RevokeLease(member_lease_);
    member_lease_ = 0;
  }
  if (campaign_.joinable()) campaign_.join();
  if (monitor_.joinable()) monitor_.join();
  if (watcher_ != nullptr) watcher_->Stop();
  DropLease(/*revoke=*/true);
}

}  // namespace orthoserve
