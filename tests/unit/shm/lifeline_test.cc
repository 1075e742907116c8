// Lifelines (docs/shared_memory.md, "Lifetime"): a region is dropped when the handover connection
// it came through ends — in the registry (DropLifeline: staged and registered regions, leases kept,
// unregister first is a no-op) and on a real socket (the client closing its end, the server letting
// go of lifelines whose region is gone, the cap on held connections).
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shm/handover_socket.h"
#include "server/shm/region_registry.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Dropped = RegionRegistry::Dropped;

constexpr int64_t kSize = 1 << 16;

// Host memory that says when it is let go of (unmapped, for a real region).
class TrackedMemory : public RegionMemory {
 public:
  explicit TrackedMemory(std::atomic<bool>* gone) : bytes_(kSize), gone_(gone) {}
  ~TrackedMemory() override { *gone_ = true; }
  char* data() const override { return const_cast<char*>(bytes_.data()); }
  int64_t size() const override { return kSize; }

 private:
  std::vector<char> bytes_;
  std::atomic<bool>* const gone_;
};

// Stages TrackedMemory through `lifeline` and claims it for `tenant`; its id.
std::string Register(RegionRegistry& registry, uint64_t lifeline, std::atomic<bool>* gone,
                     const std::string& tenant = "alice") {
  absl::StatusOr<std::string> ticket = registry.Stage(std::make_unique<TrackedMemory>(gone), PeerIdentity{}, lifeline);
  EXPECT_OK(ticket.status());
  absl::StatusOr<RegionInfo> info = registry.Claim(tenant, ticket.value_or(""), "momenta");
  EXPECT_OK(info.status());
  return info.ok() ? info->id : "";
}

TEST(RegionLifelineTest, ARegisteredRegionWhoseLifelineEndsIsDropped) {
  // Before the registry: its regions tell them when they go, the last at its destruction.
  std::atomic<bool> gone{false}, gone2{false};
  RegionRegistry::Options options;
  options.max_regions_per_tenant = 1;
  RegionRegistry registry(options);
  const std::string id = Register(registry, 7, &gone);
  EXPECT_TRUE(registry.Holds(7));
  EXPECT_EQ(registry.DropLifeline(7), Dropped::kRegistered);
  EXPECT_TRUE(gone);  // No lease: unmapped at once.
  EXPECT_TRUE(registry.List("alice").empty());
  EXPECT_EQ(registry.regions(), 0);
  EXPECT_FALSE(registry.Holds(7));
  EXPECT_THAT(registry.Use("alice", id, 0, 8), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  EXPECT_THAT(registry.Unregister("alice", id, absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  // The tenant's place is free again.
  EXPECT_NE(Register(registry, 8, &gone2), "");
  EXPECT_EQ(registry.DropLifeline(7), Dropped::kNothing);  // Ending twice changes nothing.
  EXPECT_EQ(registry.List("alice").size(), 1u);
}

TEST(RegionLifelineTest, AStepInFlightKeepsTheMemoryUntilItsLeaseGoes) {
  std::atomic<bool> gone{false};  // Before the registry, whose regions may tell it at its end.
  RegionRegistry registry({});
  const std::string id = Register(registry, 1, &gone);
  absl::StatusOr<RegionLease> lease = registry.Use("alice", id, 0, kSize);
  ASSERT_OK(lease.status());
  EXPECT_EQ(registry.DropLifeline(1), Dropped::kRegistered);
  // New uses are NOT_FOUND at once; the step's memory stays.
  EXPECT_THAT(registry.Use("alice", id, 0, 8), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_TRUE(registry.List("alice").empty());
  EXPECT_FALSE(gone);
  lease->data()[kSize - 1] = 5;
  EXPECT_EQ(lease->data()[kSize - 1], 5);
  lease->Release();
  EXPECT_TRUE(gone);
}

TEST(RegionLifelineTest, AStagedRegionIsDroppedToo) {
  std::atomic<bool> gone{false};  // Before the registry, whose regions may tell it at its end.
  RegionRegistry registry({});
  absl::StatusOr<std::string> ticket = registry.Stage(std::make_unique<TrackedMemory>(&gone), PeerIdentity{}, 3);
  ASSERT_OK(ticket.status());
  EXPECT_EQ(registry.pending(), 1);
  EXPECT_EQ(registry.DropLifeline(3), Dropped::kStaged);
  EXPECT_TRUE(gone);
  EXPECT_EQ(registry.pending(), 0);
  EXPECT_THAT(registry.Claim("alice", *ticket, "m"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("ticket")));
}

TEST(RegionLifelineTest, EndingALifelineAfterUnregisterOrExpiryIsANoOp) {
  absl::Time now = absl::Now();
  std::atomic<bool> gone{false}, other_gone{false}, staged_gone{false};  // Before the registry.
  RegionRegistry::Options options;
  options.now = [&now] { return now; };
  RegionRegistry registry(options);
  const std::string id = Register(registry, 1, &gone);
  const std::string other = Register(registry, 2, &other_gone);
  EXPECT_OK(registry.Unregister("alice", id, absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(gone);
  EXPECT_FALSE(registry.Holds(1));
  EXPECT_EQ(registry.DropLifeline(1), Dropped::kNothing);
  // The other region (and its lifeline) is untouched.
  EXPECT_TRUE(registry.Holds(2));
  ASSERT_EQ(registry.List("alice").size(), 1u);
  EXPECT_EQ(registry.List("alice")[0].id, other);
  // An expired ticket lets go of its lifeline as well.
  ASSERT_OK(registry.Stage(std::make_unique<TrackedMemory>(&staged_gone), PeerIdentity{}, 4).status());
  now += options.ticket_timeout;
  EXPECT_EQ(registry.PruneExpired(), 1);
  EXPECT_FALSE(registry.Holds(4));
  EXPECT_EQ(registry.DropLifeline(4), Dropped::kNothing);
}

TEST(RegionLifelineTest, ALifelineHoldsOneRegion) {
  std::atomic<bool> first{false}, second{false};
  RegionRegistry registry({});
  ASSERT_OK(registry.Stage(std::make_unique<TrackedMemory>(&first), PeerIdentity{}, 9).status());
  EXPECT_THAT(registry.Stage(std::make_unique<TrackedMemory>(&second), PeerIdentity{}, 9),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lifeline 9")));
  EXPECT_TRUE(second);  // Dropped on error.
  EXPECT_FALSE(first);
}

// The socket: the same through real connections.
class SocketLifelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/orthoserve-lifeline-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    socket_.reset();
    rmdir(dir_.c_str());
  }

  void Start(int max_lifelines = 1024) {
    HandoverSocket::Options o;
    o.path = dir_ + "/shm.sock";
    o.prune_period = absl::Milliseconds(20);
    o.max_lifelines = max_lifelines;
    o.on_dropped = [this](Dropped dropped) {
      absl::MutexLock lock(&mu_);
      dropped_.push_back(dropped);
    };
    absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(o, &registry_);
    ASSERT_OK(socket.status());
    socket_ = *std::move(socket);
  }
  // Hands a fresh memfd over, keeping the connection in `*lifeline`; the answer line.
  std::string HandOverKeeping(OwnedFd* lifeline) {
    OwnedFd fd = MakeMemfd(kSize);
    const int fds[] = {fd.get()};
    return HandOver(socket_->path(), fds, 1, lifeline);
  }
  // Hands over and claims for alice; the region's id.
  std::string Register(OwnedFd* lifeline) {
    const std::string answer = HandOverKeeping(lifeline);
    EXPECT_THAT(answer, StartsWith("OK "));
    absl::StatusOr<RegionInfo> info = registry_.Claim("alice", answer.size() > 3 ? answer.substr(3) : "", "m");
    EXPECT_OK(info.status());
    return info.ok() ? info->id : "";
  }
  // Polls `done` until it holds or 10 s passed; whether it held.
  static bool Eventually(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }
  std::vector<Dropped> dropped() {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }

  std::string dir_;
  RegionRegistry registry_{RegionRegistry::Options{}};
  std::unique_ptr<HandoverSocket> socket_;
  absl::Mutex mu_;
  std::vector<Dropped> dropped_ ABSL_GUARDED_BY(mu_);
};

TEST_F(SocketLifelineTest, ClosingTheConnectionDropsTheRegionsStagedOrRegisteredThroughIt) {
  Start();
  OwnedFd registered_line, staged_line, kept_line;
  const std::string registered = Register(&registered_line);
  ASSERT_THAT(HandOverKeeping(&staged_line), StartsWith("OK "));
  const std::string kept = Register(&kept_line);
  ASSERT_EQ(registry_.List("alice").size(), 2u);
  ASSERT_EQ(registry_.pending(), 1);

  registered_line = OwnedFd();  // As the kernel does when the process dies.
  ASSERT_TRUE(Eventually([&] { return registry_.List("alice").size() == 1; }));
  EXPECT_EQ(registry_.List("alice")[0].id, kept);
  EXPECT_THAT(registry_.Use("alice", registered, 0, 8), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  staged_line = OwnedFd();
  ASSERT_TRUE(Eventually([&] { return registry_.pending() == 0; }));
  ASSERT_TRUE(Eventually([&] { return dropped().size() == 2; }));
  EXPECT_EQ(dropped(), (std::vector<Dropped>{Dropped::kRegistered, Dropped::kStaged}));
  // A byte on a lifeline is no part of the protocol: it ends the lifeline too.
  ASSERT_EQ(send(kept_line.get(), "x", 1, MSG_NOSIGNAL), 1);
  ASSERT_TRUE(Eventually([&] { return registry_.List("alice").empty(); }));
}

TEST_F(SocketLifelineTest, AfterUnregisterTheServerLetsGoOfTheConnectionAndClosingItIsANoOp) {
  Start();
  OwnedFd line;
  const std::string id = Register(&line);
  ASSERT_OK(registry_.Unregister("alice", id, absl::Now() + absl::Seconds(10)));
  // The server closes its end within a prune period: the client reads EOF.
  pollfd p{line.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  char byte;
  EXPECT_EQ(recv(line.get(), &byte, 1, 0), 0);
  line = OwnedFd();
  OwnedFd next;
  Register(&next);  // The socket goes on.
  EXPECT_EQ(registry_.List("alice").size(), 1u);
  EXPECT_TRUE(dropped().empty());
}

TEST_F(SocketLifelineTest, HeldConnectionsAreCapped) {
  Start(/*max_lifelines=*/2);
  OwnedFd a, b, c;
  Register(&a);
  ASSERT_THAT(HandOverKeeping(&b), StartsWith("OK "));
  EXPECT_THAT(HandOverKeeping(&c),
              StartsWith("ERR RESOURCE_EXHAUSTED the server holds 2 handover connections already"));
  EXPECT_EQ(registry_.pending(), 1);
  // One region's owner goes: its place is free for the next hand-over.
  a = OwnedFd();
  ASSERT_TRUE(Eventually([&] { return registry_.List("alice").empty(); }));
  EXPECT_THAT(HandOverKeeping(&c), StartsWith("OK "));
}

}  // namespace
}  // namespace orthoserve
