// EtcdLeadership against a real etcd on loopback: among candidates exactly one leads and every
// one follows it; a resignation, or a lease that etcd drops (as when a leader dies or stops for
// longer than its TTL), hands leadership on with a higher term within about the TTL; while etcd
// does not answer nothing changes and reachable() says so.
#include "server/fleet/wire/etcd_leadership.h"

#include <signal.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/etcd/etcd_process.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

constexpr absl::Duration kTtl = absl::Seconds(2);

// One rank's view, as its callbacks told it.
struct Candidate {
  int rank = 0;
  absl::Mutex mu;
  int64_t elected = 0;  // Term this rank leads (0: none).
  std::vector<int64_t> deposed;
  LeaderInfo leader;
  absl::flat_hash_map<int, uint64_t> listed;  // The last on_listed.
  std::map<std::string, int> refused;          // on_refused's calls, by what.
  std::unique_ptr<EtcdLeadership> leadership;
};

std::unique_ptr<Candidate> Start(const std::string& endpoints, const std::string& prefix, int rank) {
  auto c = std::make_unique<Candidate>();
  c->rank = rank;
  EtcdLeadership::Options o;
  o.etcd.endpoints = endpoints;
  o.etcd.dial_timeout = absl::Seconds(1);
  o.etcd.call_timeout = kTtl;
  o.prefix = prefix;
  o.world = 3;
  o.rank = rank;
  o.address = absl::StrCat("127.0.0.1:", 7000 + rank);
  o.ttl = kTtl;
  Candidate* raw = c.get();
  o.on_elected = [raw](int64_t term) {
    absl::MutexLock lock(&raw->mu);
    raw->elected = term;
  };
  o.on_deposed = [raw](int64_t term, const absl::Status&) {
    absl::MutexLock lock(&raw->mu);
    raw->elected = 0;
    raw->deposed.push_back(term);
  };
  o.on_leader = [raw](const LeaderInfo& leader) {
    absl::MutexLock lock(&raw->mu);
    EXPECT_GT(leader.term, raw->leader.term) << "terms only grow";
    raw->leader = leader;
  };
  o.incarnation = 100 + rank;
  o.on_listed = [raw](const absl::flat_hash_map<int, uint64_t>& listed) {
    absl::MutexLock lock(&raw->mu);
    raw->listed = listed;
  };
  o.on_refused = [raw](absl::string_view what) {
    absl::MutexLock lock(&raw->mu);
    ++raw->refused[std::string(what)];
  };
  absl::StatusOr<std::unique_ptr<EtcdLeadership>> l = EtcdLeadership::Start(o);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return nullptr;
  c->leadership = std::move(*l);
  return c;
}

// Waits until exactly one of `candidates` leads (above `above_term`) and every one of them
// follows it at that term; returns the leader's rank (-1 on timeout).
int WaitOneLeader(const std::vector<Candidate*>& candidates, absl::Duration timeout, int64_t above_term = 0) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int leader = -1, leaders = 0;
    int64_t term = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      absl::MutexLock lock(&candidates[i]->mu);
      if (candidates[i]->elected > above_term) {
        leader = candidates[i]->rank;
        term = candidates[i]->elected;
        ++leaders;
      }
    }
    bool agree = leaders == 1;
    for (Candidate* c : candidates) {
      absl::MutexLock lock(&c->mu);
      agree = agree && c->leader.term == term && c->leader.rank == leader;
    }
    if (agree) return leader;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

int64_t TermOf(Candidate& c) {
  absl::MutexLock lock(&c.mu);
  return c.elected;
}

class EtcdLeadershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> cluster = testing::EtcdCluster::Start(1);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    for (int r = 0; r < 3; ++r) {
      owned_.push_back(Start(cluster_->endpoints(), "/test/fleet", r));
      ASSERT_NE(owned_.back(), nullptr);
      candidates_.push_back(owned_.back().get());
    }
  }

  std::unique_ptr<testing::EtcdCluster> cluster_;
  std::vector<std::unique_ptr<Candidate>> owned_;
  std::vector<Candidate*> candidates_;
};

TEST_F(EtcdLeadershipTest, OneLeadsAndEveryoneFollowsIt) {
  const int leader = WaitOneLeader(candidates_, absl::Seconds(10));
  ASSERT_GE(leader, 0);
  absl::MutexLock lock(&candidates_[0]->mu);
  EXPECT_EQ(candidates_[0]->leader.address, absl::StrCat("127.0.0.1:", 7000 + leader));
  EXPECT_EQ(candidates_[leader]->leadership->leading_term(), candidates_[0]->leader.term);
}

TEST_F(EtcdLeadershipTest, AResignationHandsLeadershipOnAtOnce) {
  const int first = WaitOneLeader(candidates_, absl::Seconds(10));
  ASSERT_GE(first, 0);
  const int64_t term = TermOf(*candidates_[first]);
  const absl::Time start = absl::Now();
  candidates_[first]->leadership->Resign();
  {
    absl::MutexLock lock(&candidates_[first]->mu);
    EXPECT_THAT(candidates_[first]->deposed, ::testing::ElementsAre(term)) << "Resign returns after on_deposed";
  }
  std::vector<Candidate*> others;
  for (int i = 0; i < 3; ++i) {
    if (i != first) others.push_back(candidates_[i]);
  }
  const int next = WaitOneLeader(others, absl::Seconds(10), term);
  ASSERT_GE(next, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "a successor should not wait for the TTL";
  // The resigned rank still follows etcd, and never leads again.
  absl::SleepFor(absl::Milliseconds(300));
  absl::MutexLock lock(&candidates_[first]->mu);
  EXPECT_GT(candidates_[first]->leader.term, term);
  EXPECT_EQ(candidates_[first]->elected, 0);
}

TEST_F(EtcdLeadershipTest, ALeaderWhoseLeaseEtcdDropsIsDeposedAndReplaced) {
  const int first = WaitOneLeader(candidates_, absl::Seconds(10));
  ASSERT_GE(first, 0);
  const int64_t term = TermOf(*candidates_[first]);
  // What etcd does when a leader dies or stops for longer than its TTL: the lease ends.
  etcd::EtcdOptions options;
  options.endpoints = cluster_->endpoints();
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_OK(client);
  absl::StatusOr<etcd::KeyValue> key = (*client)->Leader("/test/fleet/coordinator");
  ASSERT_OK(key);
  EXPECT_EQ(key->create_revision, term);
  const absl::Time start = absl::Now();
  ASSERT_OK((*client)->RevokeLease(key->lease));
  const int next = WaitOneLeader(candidates_, absl::Seconds(10), term);
  ASSERT_GE(next, 0);
  EXPECT_LT(absl::Now() - start, kTtl + absl::Seconds(1));
  absl::MutexLock lock(&candidates_[first]->mu);
  EXPECT_THAT(candidates_[first]->deposed, ::testing::Contains(term));
}

// Waits until `c`'s listing satisfies `want`.
bool WaitListed(Candidate& c, const std::function<bool(const absl::flat_hash_map<int, uint64_t>&)>& want,
                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&c.mu);
      if (want(c.listed)) return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Every rank keeps a liveness key with its incarnation; one that stops is unlisted at once (its
// lease revoked), and one whose lease etcd drops puts its key again on a new one.
TEST_F(EtcdLeadershipTest, EveryRankIsListedWithItsIncarnationUntilItsLeaseEnds) {
  const absl::flat_hash_map<int, uint64_t> all = {{0, 100}, {1, 101}, {2, 102}};
  auto is = [](const absl::flat_hash_map<int, uint64_t>& want) {
    return [want](const absl::flat_hash_map<int, uint64_t>& listed) { return listed == want; };
  };
  ASSERT_TRUE(WaitListed(*candidates_[0], is(all), 2 * kTtl + absl::Seconds(2)));

  etcd::EtcdOptions options;
  options.endpoints = cluster_->endpoints();
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_OK(client);
  absl::StatusOr<std::optional<etcd::KeyValue>> key = (*client)->Get("/test/fleet/members/1");
  ASSERT_OK(key);
  ASSERT_TRUE(key->has_value());
  EXPECT_EQ((*key)->value, "101 127.0.0.1:7001");
  ASSERT_OK((*client)->RevokeLease((*key)->lease));  // What etcd does when rank 1 stops for its TTL.
  // Rank 1 notices (its keep-alive finds no lease) and puts its key again on a new lease.
  const absl::Time revoked = absl::Now();
  std::optional<etcd::KeyValue> again;
  while (absl::Now() - revoked < kTtl + absl::Seconds(2)) {
    absl::StatusOr<std::optional<etcd::KeyValue>> now = (*client)->Get("/test/fleet/members/1");
    ASSERT_OK(now);
    if (now->has_value() && (*now)->lease != (*key)->lease) {
      again = *now;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(again.has_value()) << "rank 1 did not put its key again";
  EXPECT_EQ(again->value, "101 127.0.0.1:7001");
  ASSERT_TRUE(WaitListed(*candidates_[0], is(all), absl::Seconds(2)));

  const absl::Time stop = absl::Now();
  candidates_[2]->leadership->Stop();
  ASSERT_TRUE(WaitListed(*candidates_[0], is({{0, 100}, {1, 101}}), absl::Seconds(2)));
  EXPECT_LT(absl::Now() - stop, absl::Seconds(2));
}

TEST_F(EtcdLeadershipTest, NothingChangesWhileEtcdDoesNotAnswer) {
  const int first = WaitOneLeader(candidates_, absl::Seconds(10));
  ASSERT_GE(first, 0);
  const int64_t term = TermOf(*candidates_[first]);
  cluster_->Signal(0, SIGSTOP);
  absl::SleepFor(2 * kTtl);
  for (Candidate* c : candidates_) EXPECT_FALSE(c->leadership->reachable());
  EXPECT_EQ(candidates_[first]->leadership->leading_term(), term) << "the leader leads on without etcd";
  for (int i = 0; i < 3; ++i) {
    if (i != first) {
      EXPECT_EQ(TermOf(*candidates_[i]), 0);
    }
  }
  cluster_->Signal(0, SIGCONT);
  // etcd decides when it answers again (it may have let the lease lapse): one leader, followed.
  ASSERT_GE(WaitOneLeader(candidates_, absl::Seconds(15)), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool reachable = false;
  while (!reachable && absl::Now() < deadline) {
    reachable = true;
    for (Candidate* c : candidates_) reachable = reachable && c->leadership->reachable();
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(reachable);
}

// etcd content is input: keys that no rank of this fleet wrote, put before the ranks start (so
// that etcd names them leader), and liveness keys of no rank.
class EtcdContentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> cluster = testing::EtcdCluster::Start(1);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    etcd::EtcdOptions options;
    options.endpoints = cluster_->endpoints();
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
    ASSERT_OK(client);
    client_ = std::move(*client);
  }
  void StartCandidates() {
    for (int r = 0; r < 3; ++r) {
      owned_.push_back(Start(cluster_->endpoints(), "/test/fleet", r));
      ASSERT_NE(owned_.back(), nullptr);
      candidates_.push_back(owned_.back().get());
    }
  }
  // Puts `value` under the election prefix, on a long lease (lease = true) or on none.
  void PutLeaderKey(const std::string& value, bool lease) {
    int64_t id = 0;
    if (lease) {
      absl::StatusOr<etcd::Lease> granted = client_->GrantLease(absl::Seconds(120));
      ASSERT_OK(granted);
      id = granted->id;
    }
    ASSERT_OK(client_->Put(kBadKey, value, id));
  }
  // While the bad key leads: no candidate is elected, each follows "nobody" (rank -1) in its
  // term, and each counts the key once; then it is deleted and one leads within the TTL.
  void ExpectNobodyLeadsUntilTheKeyIsDeleted() {
    absl::SleepFor(2 * kTtl);
    for (Candidate* c : candidates_) {
      absl::MutexLock lock(&c->mu);
      EXPECT_EQ(c->elected, 0) << "rank " << c->rank << " leads behind a key that etcd names leader";
      EXPECT_GT(c->leader.term, 0) << "rank " << c->rank;
      EXPECT_EQ(c->leader.rank, -1) << "rank " << c->rank;
      EXPECT_EQ(c->refused["leader"], 1) << "rank " << c->rank;
    }
    const absl::Time removed = absl::Now();
    ASSERT_OK(client_->Delete(kBadKey));
    ASSERT_GE(WaitOneLeader(candidates_, kTtl + absl::Seconds(1)), 0) << "no leader after the key was deleted";
    EXPECT_LT(absl::Now() - removed, kTtl + absl::Seconds(1));
  }

  static constexpr char kBadKey[] = "/test/fleet/coordinator/0";
  std::unique_ptr<testing::EtcdCluster> cluster_;
  std::unique_ptr<etcd::EtcdClient> client_;
  std::vector<std::unique_ptr<Candidate>> owned_;
  std::vector<Candidate*> candidates_;
};

TEST_F(EtcdContentTest, ALeaderKeyNamingARankOutsideTheWorldIsNoLeader) {
  PutLeaderKey("2147483647 127.0.0.1:7000", /*lease=*/true);
  StartCandidates();
  ExpectNobodyLeadsUntilTheKeyIsDeleted();
}

TEST_F(EtcdContentTest, ALeaderKeyWithoutALeaseIsNoLeader) {
  PutLeaderKey("0 127.0.0.1:7000", /*lease=*/false);  // A rank's own value, but on no lease.
  StartCandidates();
  ExpectNobodyLeadsUntilTheKeyIsDeleted();
}

TEST_F(EtcdContentTest, ALeaderKeyWithAnUnusableAddressIsNoLeader) {
  PutLeaderKey("1 unix:/tmp/not-a-rank", /*lease=*/true);
  StartCandidates();
  ExpectNobodyLeadsUntilTheKeyIsDeleted();
}

TEST_F(EtcdContentTest, LivenessKeysOfNoRankListNobody) {
  absl::StatusOr<etcd::Lease> lease = client_->GrantLease(absl::Seconds(120));
  ASSERT_OK(lease);
  for (const char* rank : {"3", "2147483647", "-1", "01", "x", "1/x"}) {
    ASSERT_OK(client_->Put(absl::StrCat("/test/fleet/members/", rank), "7 127.0.0.1:7000", lease->id));
  }
  ASSERT_OK(client_->Put("/test/fleet/members/4", "garbage", lease->id));
  StartCandidates();
  const absl::flat_hash_map<int, uint64_t> all = {{0, 100}, {1, 101}, {2, 102}};
  ASSERT_TRUE(WaitListed(*candidates_[0], [&](const auto& listed) { return listed == all; }, 2 * kTtl + absl::Seconds(2)));
  // Each refused value is counted once however often it is read; a lease-less key is refused
  // too (it would list its rank after the rank is gone).
  absl::SleepFor(kTtl);
  {
    absl::MutexLock lock(&candidates_[0]->mu);
    EXPECT_EQ(candidates_[0]->refused["member"], 7);
  }
  ASSERT_OK(client_->Put("/test/fleet/members/2", "102 127.0.0.1:7002"));  // Rank 2's key, lease dropped.
  ASSERT_TRUE(WaitListed(*candidates_[0], [&](const auto& listed) { return !listed.contains(2); }, 2 * kTtl));
  ASSERT_GE(WaitOneLeader(candidates_, absl::Seconds(10)), 0) << "the ranks elect a leader all the same";
}

}  // namespace
}  // namespace orthoserve
