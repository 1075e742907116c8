// Leases and LeaseKeeper against a real etcd: keys live while the keeper runs and vanish a TTL
// after it stops; a revoked lease is reported lost.
#include <atomic>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/etcd/lease_keeper.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

using EtcdLeaseTest = EtcdTest;

// Polls until `key` is gone or `timeout` passes; returns whether it went.
bool WaitGone(etcd::EtcdClient& client, const std::string& key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::optional<etcd::KeyValue>> got = client.Get(key);
    if (got.ok() && !got->has_value()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST_F(EtcdLeaseTest, KeysStayWhileKeptAndVanishAfterTheKeeperStops) {
  absl::StatusOr<etcd::Lease> lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_OK(lease);
  EXPECT_GE(lease->ttl_seconds, 2);
  ASSERT_OK(client_->Put("/members/a", "alive", lease->id));
  absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper =
      etcd::LeaseKeeper::Start(&client_->pool(), {.lease_id = lease->id, .ttl = absl::Seconds(lease->ttl_seconds)});
  ASSERT_OK(keeper);

  // Twice the TTL: without the keeper the key would be gone.
  absl::SleepFor(absl::Seconds(2 * lease->ttl_seconds));
  EXPECT_OK((*keeper)->status());
  EXPECT_GT((*keeper)->last_renewed(), absl::Now() - absl::Seconds(lease->ttl_seconds));
  absl::StatusOr<std::optional<etcd::KeyValue>> got = client_->Get("/members/a");
  ASSERT_OK(got);
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->lease, lease->id);

  const absl::Time stopped = absl::Now();
  (*keeper)->Stop();
  EXPECT_LT(absl::Now() - stopped, absl::Milliseconds(500));  // Stop cancels the stream's wait.
  EXPECT_THAT((*keeper)->status(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("stopped")));
  EXPECT_TRUE(WaitGone(*client_, "/members/a", absl::Seconds(lease->ttl_seconds + 3)));
  // Not before the TTL (less the keeper's last interval) ran out.
  EXPECT_GE(absl::Now() - stopped, absl::Seconds(lease->ttl_seconds) / 2);
}

// What a rank asks of a leader key's lease: the time it has left, NOT_FOUND once it is gone
// (whatever the key says).
TEST_F(EtcdLeaseTest, TimeToLiveIsWhatTheLeaseHasLeftAndNotFoundOnceItIsGone) {
  absl::StatusOr<etcd::Lease> lease = client_->GrantLease(absl::Seconds(30));
  ASSERT_OK(lease);
  absl::StatusOr<absl::Duration> left = client_->LeaseTimeToLive(lease->id);
  ASSERT_OK(left);
  EXPECT_GT(*left, absl::Seconds(25));
  EXPECT_LE(*left, absl::Seconds(30));
  ASSERT_OK(client_->RevokeLease(lease->id));
  EXPECT_THAT(client_->LeaseTimeToLive(lease->id),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("etcd holds no such lease")));
  EXPECT_THAT(client_->LeaseTimeToLive(0x7eadbeef), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such lease")));
}

TEST_F(EtcdLeaseTest, KeeperReportsLossWhenTheLeaseIsRevoked) {
  absl::StatusOr<etcd::Lease> lease = client_->GrantLease(absl::Seconds(3));
  ASSERT_OK(lease);
  ASSERT_OK(client_->Put("/members/b", "alive", lease->id));
  absl::Notification lost;
  absl::Status lost_status;
  absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper =
      etcd::LeaseKeeper::Start(&client_->pool(), {.lease_id = lease->id,
                                                  .ttl = absl::Seconds(lease->ttl_seconds),
                                                  .interval = absl::Milliseconds(300),
                                                  .on_lost = [&](const absl::Status& status) {
                                                    lost_status = status;
                                                    lost.Notify();
                                                  }});
  ASSERT_OK(keeper);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_OK((*keeper)->status());

  ASSERT_OK(client_->RevokeLease(lease->id));
  EXPECT_THAT(client_->Get("/members/b"), IsOkAndHolds(::testing::Eq(std::nullopt)));
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_THAT(lost_status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("expired or revoked")));
  EXPECT_THAT((*keeper)->status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("revoked")));
}

TEST_F(EtcdLeaseTest, KeeperReportsLossWhenEtcdIsGoneForAWholeTtl) {
  absl::StatusOr<etcd::Lease> lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_OK(lease);
  absl::Notification lost;
  absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper =
      etcd::LeaseKeeper::Start(&client_->pool(), {.lease_id = lease->id,
                                                  .ttl = absl::Seconds(lease->ttl_seconds),
                                                  .on_lost = [&](const absl::Status&) { lost.Notify(); }});
  ASSERT_OK(keeper);
  absl::SleepFor(absl::Milliseconds(300));
  cluster_->Kill(0);
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(lease->ttl_seconds + 3)));
  EXPECT_THAT((*keeper)->status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("whole TTL")));
}

TEST_F(EtcdLeaseTest, StartRejectsBadOptions) {
  EXPECT_THAT(etcd::LeaseKeeper::Start(&client_->pool(), {.lease_id = 0, .ttl = absl::Seconds(2)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lease_id")));
  EXPECT_THAT(etcd::LeaseKeeper::Start(&client_->pool(),
                                       {.lease_id = 1, .ttl = absl::Seconds(2), .interval = absl::Seconds(3)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("interval")));
}

}  // namespace
}  // namespace orthoserve::testing
