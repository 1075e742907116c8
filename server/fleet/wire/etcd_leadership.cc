// Implementation of server/fleet/wire/etcd_leadership.h.
#include "server/fleet/wire/etcd_leadership.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status.h"

namespace orthoserve {

std::string LeaderValue(int rank, const std::string& address) { return absl::StrCat(rank, " ", address); }

absl::StatusOr<LeaderInfo> ParseLeaderValue(const std::string& value, int64_t term) {
  std::vector<std::string> parts = absl::StrSplit(value, absl::MaxSplits(' ', 1));
  LeaderInfo info;
  info.term = term;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &info.rank) || info.rank < 0 || parts[1].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the fleet's leader key holds \"", value.substr(0, 200),
                                                   "\", not \"<rank> <fleet address>\""));
  }
  info.address = parts[1];
  return info;
}

absl::StatusOr<std::unique_ptr<EtcdLeadership>> EtcdLeadership::Start(Options options) {
  if (options.prefix.empty() || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("the fleet's etcd prefix \"", options.prefix, "\" must be non-empty and not end with /"));
  }
  if (options.address.empty()) return absl::InvalidArgumentError("EtcdLeadership needs this rank's fleet address");
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

void EtcdLeadership::Check() {
  absl::StatusOr<etcd::KeyValue> kv = client_->Leader(election_);
  if (!kv.ok() && !absl::IsNotFound(kv.status())) {
    Reached(kv.status());
    return;
  }
  Reached(absl::OkStatus());
  absl::MutexLock callbacks(&callback_mu_);
  std::optional<LeaderInfo> changed;
  bool restart_keeper = false;
  {
    absl::MutexLock lock(&mu_);
    if (kv.ok()) {
      absl::StatusOr<LeaderInfo> info = ParseLeaderValue(kv->value, kv->create_revision);
      if (!info.ok()) {
        LOG_WARNING("fleet") << info.status();
      } else if (info->term > leader_.term) {
        leader_ = *info;
        leader_key_ = kv->key;
        changed = *info;
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
                                               absl::StrCat(options_.incarnation, " ", options_.address), lease->id);
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
  absl::flat_hash_map<int, uint64_t> ranks;
  for (const etcd::KeyValue& kv : listed->kvs) {
    int rank;
    uint64_t incarnation;
    std::vector<std::string> parts = absl::StrSplit(kv.value, absl::MaxSplits(' ', 1));
    if (!absl::SimpleAtoi(kv.key.substr(members.size()), &rank) || parts.empty() ||
        !absl::SimpleAtoi(parts[0], &incarnation)) {
      LOG_WARNING("fleet") << "etcd key " << kv.key << " is not a fleet liveness key (\"" << kv.value.substr(0, 100)
                           << "\"); ignored";
      continue;
    }
    ranks[rank] = incarnation;
  }
  absl::MutexLock callbacks(&callback_mu_);
  options_.on_listed(ranks);
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
