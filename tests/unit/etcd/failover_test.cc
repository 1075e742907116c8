// The etcd client against a three-member cluster: calls, a lease keeper and a watcher carry on
// when the member they were using is killed.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/etcd/etcd_client.h"
#include "server/etcd/lease_keeper.h"
#include "server/etcd/watcher.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

TEST(EtcdFailoverTest, CallsLeasesAndWatchesSurviveTheLossOfAMember) {
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(3);
  ASSERT_OK(cluster);
  etcd::EtcdOptions options;
  options.endpoints = (*cluster)->endpoints();  // Member 0 first: the client starts there.
  options.dial_timeout = absl::Seconds(1);
  options.call_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_OK(client);
  etcd::EtcdClient& etcd = **client;

  ASSERT_OK(etcd.Put("/f/before", "1"));
  absl::StatusOr<etcd::Lease> lease = etcd.GrantLease(absl::Seconds(3));
  ASSERT_OK(lease);
  ASSERT_OK(etcd.Put("/f/member", "alive", lease->id));
  absl::StatusOr<std::unique_ptr<etcd::LeaseKeeper>> keeper =
      etcd::LeaseKeeper::Start(&etcd.pool(), {.lease_id = lease->id, .ttl = absl::Seconds(lease->ttl_seconds)});
  ASSERT_OK(keeper);

  absl::Mutex mu;
  std::vector<std::string> seen;
  absl::StatusOr<std::unique_ptr<etcd::Watcher>> watcher = etcd::Watcher::Start(
      &etcd.pool(), {.prefix = "/f/w/", .on_events = [&](const std::vector<etcd::WatchEvent>& events) {
                       absl::MutexLock lock(&mu);
                       for (const etcd::WatchEvent& e : events) seen.push_back(e.key);
                     }});
  ASSERT_OK(watcher);
  ASSERT_OK(etcd.Put("/f/w/1", "x"));

  (*cluster)->Kill(0);
  // Calls fail over to the surviving members, and the cluster takes a raft election if member 0
  // led it. What a write right after the kill gets back is a race etcd owns: a write that went
  // out on the still-open connection is UNAVAILABLE "may or may not have been applied" and is not
  // sent on (endpoint_pool.h); one that reached a follower before it noticed the lost leader is
  // forwarded to it and dropped, and its call runs out of time (DEADLINE_EXCEEDED). Both say the
  // outcome is unknown; this write is idempotent, so the caller sends it again, and the cluster
  // must take it within a few call timeouts.
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> put = etcd.Put("/f/after", "2");
  for (int attempt = 1; !put.ok() && attempt < 3; ++attempt) {
    EXPECT_THAT(put.status().code(),
                ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << put.status();
    if (put.status().code() == absl::StatusCode::kUnavailable) {
      EXPECT_THAT(put.status().message(), HasSubstr("may or may not have been applied"));
    }
    put = etcd.Put("/f/after", "2");
  }
  ASSERT_OK(put);
  EXPECT_LT(absl::Now() - start, 3 * options.call_timeout + absl::Seconds(1));
  EXPECT_THAT(etcd.Get("/f/before"), IsOkAndHolds(::testing::Optional(::testing::Field(&etcd::KeyValue::value, "1"))));
  ASSERT_OK(etcd.Put("/f/w/2", "y"));

  // The keeper moved too: after twice the TTL its key is still there.
  absl::SleepFor(absl::Seconds(2 * lease->ttl_seconds));
  EXPECT_OK((*keeper)->status());
  EXPECT_THAT(etcd.Get("/f/member"),
              IsOkAndHolds(::testing::Optional(::testing::Field(&etcd::KeyValue::lease, lease->id))));
  {
    absl::MutexLock lock(&mu);
    auto both = [&seen]() { return seen.size() >= 2; };
    mu.AwaitWithTimeout(absl::Condition(&both), absl::Seconds(10));
    EXPECT_THAT(seen, ::testing::ElementsAre("/f/w/1", "/f/w/2"));
  }
  EXPECT_OK((*watcher)->status());
}

}  // namespace
}  // namespace orthoserve::testing
