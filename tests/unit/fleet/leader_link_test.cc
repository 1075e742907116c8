// LeaderLink without a network: coordinators in process (seats), one per term. A member follows
// one term at a time — a read of an older term is refused so that it joins the new one, a join
// answered for another epoch than the term is refused — terms never go back, and the store is
// the term's own.
#include "server/fleet/wire/leader_link.h"

#include <future>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/collective/in_memory_store.h"
#include "server/fleet/logic/coordinator.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<const CoordinatorSeat> Seat(uint64_t epoch) {
  Coordinator::Options o;
  o.fleet_world = 3;
  o.epoch = epoch;
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  auto seat = std::make_shared<CoordinatorSeat>();
  seat->coordinator = std::move(*c);
  seat->store = std::make_shared<InMemoryStore>();
  return seat;
}

Member Me() { return Member{1, "127.0.0.1:5001", 11}; }

ReaderState Reader(uint64_t epoch) {
  ReaderState r;
  r.rank = 1;
  r.epoch = epoch;
  r.incarnation = 11;
  return r;
}

TEST(LeaderLinkTest, NothingIsReachedBeforeALeaderIsKnown) {
  LeaderLink link(nullptr);
  EXPECT_EQ(link.term(), 0);
  EXPECT_THAT(link.log().Join(Me()), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no fleet coordinator")));
  EXPECT_THAT(link.store()->Set("k", "v"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no fleet coordinator")));
}

TEST(LeaderLinkTest, AMemberFollowsOneTermAtATime) {
  LeaderLink link(nullptr);
  auto five = Seat(5);
  link.Follow(5, 0, "127.0.0.1:6000", five);
  ASSERT_EQ(link.term(), 5);
  absl::StatusOr<LogSource::Joined> joined = link.log().Join(Me());
  ASSERT_OK(joined);
  EXPECT_EQ(joined->epoch, 5u);
  EXPECT_OK(link.log().Read(Reader(5), joined->log_from, absl::Milliseconds(1)).status());
  ASSERT_OK(link.store()->Set("term5/key", "x"));

  // An older term never replaces a newer one.
  link.Follow(3, 2, "127.0.0.1:6002", Seat(3));
  EXPECT_EQ(link.term(), 5);

  // Term 7: a read and a report of term 5 are refused, so the member joins term 7 at once.
  link.Follow(7, 2, "127.0.0.1:6002", Seat(7));
  EXPECT_EQ(link.term(), 7);
  EXPECT_THAT(link.log().Read(Reader(5), 0, absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("coordinator changed")));
  ReadyReport report;
  report.epoch = 5;
  EXPECT_THAT(link.log().Report(report), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("term 7")));
  joined = link.log().Join(Me());
  ASSERT_OK(joined);
  EXPECT_EQ(joined->epoch, 7u);
  // The store is term 7's: term 5's keys are not there.
  EXPECT_THAT(link.store()->Get("term5/key", absl::Milliseconds(20)), StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

// A term whose leader key no rank can use (EtcdLeadership's rank -1): nobody coordinates in it.
// Every call is UNAVAILABLE (retried by the caller) until a later term names a coordinator.
TEST(LeaderLinkTest, ATermWithoutACoordinatorReachesNobodyUntilTheNext) {
  LeaderLink link(nullptr);
  link.Follow(5, 0, "127.0.0.1:6000", Seat(5));
  link.Follow(6, -1, "", nullptr);
  EXPECT_EQ(link.term(), 6);
  EXPECT_THAT(link.log().Join(Me()), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no fleet coordinator in etcd term 6")));
  EXPECT_THAT(link.log().Read(Reader(6), 0, absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no fleet coordinator")));
  EXPECT_THAT(link.store()->Add("k", 1), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no fleet coordinator")));
  link.Follow(8, 2, "127.0.0.1:6002", Seat(8));
  absl::StatusOr<LogSource::Joined> joined = link.log().Join(Me());
  ASSERT_OK(joined);
  EXPECT_EQ(joined->epoch, 8u);
}

TEST(LeaderLinkTest, ACoordinatorAnsweringForAnotherEpochIsRefused) {
  LeaderLink link(nullptr);
  link.Follow(8, 0, "127.0.0.1:6000", Seat(9));  // etcd names term 8; this coordinator is term 9's.
  EXPECT_THAT(link.log().Join(Me()), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not for etcd's term 8")));
}

TEST(LeaderLinkTest, TheSameTermSwitchesToThisProcessesOwnSeatOnly) {
  LeaderLink link(nullptr);
  auto own = Seat(4);
  link.Follow(4, 1, "127.0.0.1:6001", own);
  ASSERT_OK(link.store()->Set("mine", "1"));
  // The same term named again as a remote address (etcd's view arriving after the election)
  // keeps the seat in process.
  link.Follow(4, 1, "127.0.0.1:6001", nullptr);
  EXPECT_THAT(link.store()->Get("mine", absl::Milliseconds(20)), ::orthoserve::testing::IsOkAndHolds("1"));
}

}  // namespace
}  // namespace orthoserve

namespace orthoserve {
namespace {

// A remote coordinator (a real fleet service on 127.0.0.1:0): a member's log read waiting on it
// ends at once when etcd names the next term, instead of at the read's deadline.
TEST(LeaderLinkTest, ACallWaitingOnTheOldCoordinatorEndsWhenTheTermMoves) {
  auto seat = Seat(5);
  FleetService service(seat->store.get(), seat->coordinator.get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);

  LeaderLink link(nullptr);
  link.Follow(5, 0, absl::StrCat("127.0.0.1:", port), nullptr);
  absl::StatusOr<LogSource::Joined> joined = link.log().Join(Me());
  ASSERT_OK(joined);
  // Nothing will be appended: the read waits its whole long poll (5 s) unless it is ended.
  const absl::Time start = absl::Now();
  auto read = std::async(std::launch::async, [&] {
    return link.log().Read(Reader(5), joined->log_from + 1000, absl::Seconds(5));
  });
  absl::SleepFor(absl::Milliseconds(300));
  link.Follow(6, 1, "127.0.0.1:1", Seat(6));
  absl::StatusOr<std::vector<LogEntry>> entries = read.get();
  EXPECT_THAT(entries, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("the coordinator moved")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  seat->coordinator->Shutdown();
  server->Shutdown();
}

}  // namespace
}  // namespace orthoserve
