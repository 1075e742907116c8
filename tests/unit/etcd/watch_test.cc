// Watcher against a real etcd: puts and deletes arrive in order, history replays from a
// revision, and the watch resumes without gaps or repeats after the stream breaks and after
// the etcd member restarts.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/etcd/watcher.h"
#include "tests/unit/etcd/etcd_fixture.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {
namespace {

using etcd::WatchEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Collects a watcher's events as "PUT key=value@rev" / "DELETE key@rev" lines.
class EventLog {
 public:
  void Add(const std::vector<WatchEvent>& events) {
    absl::MutexLock lock(&mu_);
    for (const WatchEvent& e : events) {
      lines_.push_back(e.type == WatchEvent::Type::kPut ? absl::StrCat("PUT ", e.key, "=", e.value)
                                                        : absl::StrCat("DELETE ", e.key));
      revisions_.push_back(e.mod_revision);
    }
  }

  // Waits until `count` events have arrived (10 s at most) and returns them all.
  std::vector<std::string> WaitFor(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lines_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return lines_;
  }

  std::vector<int64_t> revisions() {
    absl::MutexLock lock(&mu_);
    return revisions_;
  }

  std::function<void(const std::vector<WatchEvent>&)> Callback() {
    return [this](const std::vector<WatchEvent>& events) { Add(events); };
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> revisions_ ABSL_GUARDED_BY(mu_);
};

using EtcdWatchTest = EtcdTest;

TEST_F(EtcdWatchTest, SeesPutsAndDeletesUnderThePrefixInOrder) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<etcd::Watcher>> watcher =
      etcd::Watcher::Start(&client_->pool(), {.prefix = "/fleet/", .on_events = log.Callback()});
  ASSERT_OK(watcher);
  ASSERT_OK(client_->Put("/fleet/r0", "a"));
  ASSERT_OK(client_->Put("/other/x", "ignored"));
  ASSERT_OK(client_->Put("/fleet/r1", "b"));
  ASSERT_OK(client_->Put("/fleet/r0", "c"));
  ASSERT_OK(client_->Delete("/fleet/r1"));
  absl::StatusOr<int64_t> last = client_->Put("/fleet/r2", "d");
  ASSERT_OK(last);
  EXPECT_THAT(log.WaitFor(5), ElementsAre("PUT /fleet/r0=a", "PUT /fleet/r1=b", "PUT /fleet/r0=c", "DELETE /fleet/r1",
                                          "PUT /fleet/r2=d"));
  const std::vector<int64_t> revisions = log.revisions();
  EXPECT_TRUE(std::is_sorted(revisions.begin(), revisions.end()));
  EXPECT_EQ(revisions.back(), *last);
  EXPECT_EQ((*watcher)->next_revision(), *last + 1);
  EXPECT_OK((*watcher)->status());
  const absl::Time stopping = absl::Now();
  (*watcher)->Stop();
  EXPECT_LT(absl::Now() - stopping, absl::Milliseconds(500));  // Stop cancels the stream's wait.
  EXPECT_THAT((*watcher)->status(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("stopped")));
}

TEST_F(EtcdWatchTest, ReplaysHistoryFromAStartRevision) {
  absl::StatusOr<int64_t> first = client_->Put("/h/a", "1");
  ASSERT_OK(first);
  ASSERT_OK(client_->Put("/h/b", "2"));
  ASSERT_OK(client_->Delete("/h/a"));
  EventLog log;
  absl::StatusOr<std::unique_ptr<etcd::Watcher>> watcher = etcd::Watcher::Start(
      &client_->pool(), {.prefix = "/h/", .start_revision = *first + 1, .on_events = log.Callback()});
  ASSERT_OK(watcher);
  EXPECT_THAT(log.WaitFor(2), ElementsAre("PUT /h/b=2", "DELETE /h/a"));
}

TEST_F(EtcdWatchTest, ResumesFromItsRevisionAfterTheStreamBreaks) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<etcd::Watcher>> watcher =
      etcd::Watcher::Start(&client_->pool(), {.prefix = "/w/", .on_events = log.Callback()});
  ASSERT_OK(watcher);
  ASSERT_OK(client_->Put("/w/1", "a"));
  ASSERT_EQ(log.WaitFor(1).size(), 1u);
  (*watcher)->BreakStreamForTesting();
  // Written while the watcher reopens its stream: it must neither miss nor repeat them.
  for (int i = 2; i <= 5; ++i) ASSERT_OK(client_->Put(absl::StrCat("/w/", i), "b"));
  EXPECT_THAT(log.WaitFor(5), ElementsAre("PUT /w/1=a", "PUT /w/2=b", "PUT /w/3=b", "PUT /w/4=b", "PUT /w/5=b"));
  EXPECT_GE((*watcher)->restarts(), 1);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(log.WaitFor(5).size(), 5u);  // Nothing repeated afterwards.
}

TEST_F(EtcdWatchTest, ResumesAfterTheEtcdMemberRestarts) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<etcd::Watcher>> watcher =
      etcd::Watcher::Start(&client_->pool(), {.prefix = "/w/", .on_events = log.Callback()});
  ASSERT_OK(watcher);
  ASSERT_OK(client_->Put("/w/a", "1"));
  ASSERT_OK(client_->Delete("/w/a"));
  ASSERT_EQ(log.WaitFor(2).size(), 2u);

  cluster_->Kill(0);
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_OK(cluster_->Restart(0));
  // Likely written before the watcher is back: resumption from its revision still sees it.
  ASSERT_OK(client_->Put("/w/b", "2"));
  ASSERT_OK(client_->Put("/w/c", "3"));
  EXPECT_THAT(log.WaitFor(4), ElementsAre("PUT /w/a=1", "DELETE /w/a", "PUT /w/b=2", "PUT /w/c=3"));
  EXPECT_GE((*watcher)->restarts(), 1);
  EXPECT_OK((*watcher)->status());
}

TEST_F(EtcdWatchTest, StartRequiresACallback) {
  EXPECT_THAT(etcd::Watcher::Start(&client_->pool(), {.prefix = "/w/"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("on_events")));
}

}  // namespace
}  // namespace orthoserve::testing
