// Leader election against a real etcd: one campaigner leads, the next waits until the leader
// resigns or its lease expires and then leads with a higher revision (the fencing term);
// Campaign honours its deadline.
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "etcd/etcdserverpb/rpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/etcd/lease_keeper.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kElection[] = "/orthoserve/coordinator";

class EtcdElectionTest : public EtcdTest {
 protected:
  // A lease of `ttl` kept alive until the test ends.
  int64_t KeptLease(absl::Duration ttl) {
    absl::StatusOr<etcd::Lease> lease = client_->GrantLease(ttl);
    EXPECT_OK(lease);
    if (!lease.ok()) return 0;
    absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper =
        etcd::LeaseKeeper::Start(&client_->pool(), {.lease_id = lease->id, .ttl = absl::Seconds(lease->ttl_seconds)});
    EXPECT_OK(keeper);
    if (keeper.ok()) keepers_.push_back(std::move(*keeper));
    return lease->id;
  }

  // Writes `key` only while `leader` still leads (its key keeps its create revision).
  absl::StatusOr<bool> FencedPut(const etcd::LeaderKey& leader, const std::string& key) {
    etcdserverpb::TxnRequest txn;
    etcdserverpb::Compare* compare = txn.add_compare();
    compare->set_key(leader.key);
    compare->set_target(etcdserverpb::Compare::CREATE);
    compare->set_result(etcdserverpb::Compare::EQUAL);
    compare->set_create_revision(leader.revision);
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(absl::StrCat(leader.revision));
    absl::StatusOr<etcdserverpb::TxnResponse> response = client_->Txn(txn);
    if (!response.ok()) return response.status();
    return response->succeeded();
  }

  void TearDown() override { keepers_.clear(); }

  std::vector<std::unique_ptr<etcd::LeaseKeeper>> keepers_;
};

TEST_F(EtcdElectionTest, SecondCampaignerLeadsAfterTheFirstResigns) {
  const int64_t lease_a = KeptLease(absl::Seconds(5));
  const int64_t lease_b = KeptLease(absl::Seconds(5));
  absl::StatusOr<etcd::LeaderKey> a = client_->Campaign(kElection, lease_a, "rank-a", absl::Now() + absl::Seconds(5));
  ASSERT_OK(a);
  EXPECT_EQ(a->lease, lease_a);
  EXPECT_GT(a->revision, 0);
  absl::StatusOr<etcd::KeyValue> leader = client_->Leader(kElection);
  ASSERT_OK(leader);
  EXPECT_EQ(leader->value, "rank-a");
  EXPECT_EQ(leader->create_revision, a->revision);

  std::unique_ptr<etcd::EtcdClient> other = NewClient();
  absl::Notification b_done;
  absl::StatusOr<etcd::LeaderKey> b = absl::UnknownError("not run");
  std::thread campaigner([&] {
    b = other->Campaign(kElection, lease_b, "rank-b", absl::Now() + absl::Seconds(20));
    b_done.Notify();
  });
  EXPECT_FALSE(b_done.WaitForNotificationWithTimeout(absl::Seconds(1)));  // a still leads.
  EXPECT_THAT(FencedPut(*a, "/fenced"), IsOkAndHolds(true));

  ASSERT_OK(client_->Resign(*a));
  ASSERT_TRUE(b_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  campaigner.join();
  ASSERT_OK(b);
  EXPECT_GT(b->revision, a->revision);  // The new term fences the old leader.
  EXPECT_THAT(FencedPut(*a, "/fenced"), IsOkAndHolds(false));
  EXPECT_THAT(FencedPut(*b, "/fenced"), IsOkAndHolds(true));
  leader = client_->Leader(kElection);
  ASSERT_OK(leader);
  EXPECT_EQ(leader->value, "rank-b");

  ASSERT_OK(other->Proclaim(*b, "rank-b v2"));
  EXPECT_THAT(client_->Leader(kElection), IsOkAndHolds(::testing::Field(&etcd::KeyValue::value, "rank-b v2")));
  EXPECT_THAT(client_->Proclaim(*a, "stale"), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not leader")));
}

TEST_F(EtcdElectionTest, SecondCampaignerLeadsAfterTheLeadersLeaseExpires) {
  absl::StatusOr<etcd::Lease> short_lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_OK(short_lease);
  const int64_t lease_b = KeptLease(absl::Seconds(5));
  // No keeper for a's lease: a is a leader that died.
  absl::StatusOr<etcd::LeaderKey> a =
      client_->Campaign(kElection, short_lease->id, "rank-a", absl::Now() + absl::Seconds(5));
  ASSERT_OK(a);
  const absl::Time start = absl::Now();
  absl::StatusOr<etcd::LeaderKey> b = client_->Campaign(kElection, lease_b, "rank-b", absl::Now() + absl::Seconds(20));
  ASSERT_OK(b);
  EXPECT_GT(b->revision, a->revision);
  EXPECT_LT(absl::Now() - start, absl::Seconds(short_lease->ttl_seconds + 3));
  EXPECT_THAT(client_->Leader(kElection), IsOkAndHolds(::testing::Field(&etcd::KeyValue::value, "rank-b")));
}

TEST_F(EtcdElectionTest, CampaignHonoursItsDeadlineAndWithdraws) {
  const int64_t lease_a = KeptLease(absl::Seconds(5));
  const int64_t lease_b = KeptLease(absl::Seconds(5));
  absl::StatusOr<etcd::LeaderKey> a = client_->Campaign(kElection, lease_a, "rank-a", absl::Now() + absl::Seconds(5));
  ASSERT_OK(a);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client_->Campaign(kElection, lease_b, "rank-b", absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("campaign")));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(2));
  // The timed-out candidacy was withdrawn: once a resigns nobody leads.
  ASSERT_OK(client_->Resign(*a));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_THAT(client_->Leader(kElection), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no leader")));
}

TEST_F(EtcdElectionTest, NoLeaderIsNotFoundAndAnUnknownLeaseIsRefused) {
  EXPECT_THAT(client_->Leader("/nobody"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("")));
  EXPECT_THAT(client_->Campaign("/nobody", 4242, "x", absl::Now() + absl::Seconds(3)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("lease")));
}

}  // namespace
}  // namespace orthoserve::testing
