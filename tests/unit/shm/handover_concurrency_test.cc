// HandoverSocket serving many connections at once (issue #38, item 4): idle and trickling
// connections do not hold up a real hand-over, each has a deadline from its accept, a peer whose
// uid is not accepted is answered and closed before anything is read, and connections beyond the
// bound are refused with RESOURCE_EXHAUSTED — all counted by outcome, with lifelines unchanged.
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shm/cuda_ipc_message.h"
#include "server/shm/handover_socket.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::testing::StartsWith;

constexpr int64_t kSize = 1 << 16;

class HandoverConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/orthoserve-shm-conc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    socket_.reset();
    rmdir(dir_.c_str());
  }

  HandoverSocket::Options Options() {
    HandoverSocket::Options o;
    o.path = dir_ + "/shm.sock";
    o.prune_period = absl::Milliseconds(20);
    o.observe = [this](absl::string_view outcome) {
      absl::MutexLock lock(&mu_);
      outcomes_.emplace_back(outcome);
    };
    return o;
  }
  void Start(HandoverSocket::Options options) {
    absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(std::move(options), &registry_);
    ASSERT_OK(socket.status());
    socket_ = *std::move(socket);
  }
  // Hands a fresh memfd over, keeping the connection in `*lifeline`; the answer line.
  std::string HandOverMemfd(OwnedFd* lifeline) {
    OwnedFd fd = MakeMemfd(kSize);
    const int fds[] = {fd.get()};
    return HandOver(socket_->path(), fds, 1, lifeline);
  }
  // The outcomes observed, once there are `count` of them, or what there is after 10 s.
  std::vector<std::string> outcomes(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outcomes_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return outcomes_;
  }
  // Whether the server has closed `conn`: a read sees the end (after any answer) within `within`.
  static bool ClosedWithin(int conn, absl::Duration within) {
    const absl::Time deadline = absl::Now() + within;
    char buf[256];
    while (absl::Now() < deadline) {
      pollfd p{conn, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now())) + 1) <= 0) return false;
      const ssize_t n = recv(conn, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
  }

  std::string dir_;
  RegionRegistry registry_{RegionRegistry::Options{}};
  std::unique_ptr<HandoverSocket> socket_;
  absl::Mutex mu_;
  std::vector<std::string> outcomes_ ABSL_GUARDED_BY(mu_);
};

// The scenario of issue #38: 8 local connections that send nothing are held open on the socket;
// a trainer's hand-over right after them is answered at once, not after theirs time out.
TEST_F(HandoverConcurrencyTest, EightIdleConnectionsDoNotDelayAHandOver) {
  Start(Options());
  std::vector<OwnedFd> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(Connect(socket_->path()));
  absl::SleepFor(absl::Milliseconds(50));  // Accepted (or at least queued) before the real one.
  const absl::Time start = absl::Now();
  OwnedFd lifeline;
  const std::string answer = HandOverMemfd(&lifeline);
  const absl::Duration took = absl::Now() - start;
  ASSERT_THAT(answer, StartsWith("OK "));
  EXPECT_LT(took, absl::Seconds(1)) << "the hand-over waited for the idle connections";
  absl::StatusOr<RegionInfo> info = registry_.Claim("alice", answer.substr(3), "m");
  ASSERT_OK(info.status());
  // The lifeline works as before: its end drops the region, idle connections or not.
  lifeline = OwnedFd();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!registry_.List("alice").empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(registry_.List("alice").empty());
}

// SO_PEERCRED is read on accept: a peer whose uid is not accepted gets its answer and the end of
// the connection without having sent anything (nothing of it is read), at once.
TEST_F(HandoverConcurrencyTest, ARefusedPeerIsAnsweredAndClosedBeforeItSendsAnything) {
  HandoverSocket::Options options = Options();
  options.peer_uids = {geteuid() + 1};
  Start(options);
  const absl::Time start = absl::Now();
  OwnedFd conn = Connect(socket_->path());
  EXPECT_THAT(ReadAnswer(conn.get()), StartsWith("ERR PERMISSION_DENIED uid"));
  EXPECT_TRUE(ClosedWithin(conn.get(), absl::Milliseconds(500)));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"refused_peer"});
  // A refused peer's memfd is never taken either (the helper reads the answer even when its send
  // found the connection closed).
  OwnedFd fd = MakeMemfd(kSize);
  const int fds[] = {fd.get()};
  EXPECT_THAT(HandOver(socket_->path(), fds, 1), StartsWith("ERR PERMISSION_DENIED uid"));
  EXPECT_EQ(registry_.pending(), 0);
}

// A connection that sends nothing is answered DEADLINE_EXCEEDED at its deadline and closed.
TEST_F(HandoverConcurrencyTest, AConnectionThatSendsNothingIsAnsweredAtItsDeadline) {
  HandoverSocket::Options options = Options();
  options.message_timeout = absl::Milliseconds(300);
  Start(options);
  const absl::Time start = absl::Now();
  OwnedFd idle = Connect(socket_->path());
  EXPECT_EQ(ReadAnswer(idle.get()),
            "ERR DEADLINE_EXCEEDED no whole hand-over message within 300ms of connecting: send the memfd (or the "
            "CUDA_IPC line) at once");
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_TRUE(ClosedWithin(idle.get(), absl::Seconds(1)));
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"timed_out"});
}

// A sender that trickles a CUDA_IPC line a byte at a time never makes it whole: it is cut off at
// its deadline, counted as timed_out, and a memfd handed over meanwhile is answered at once.
TEST_F(HandoverConcurrencyTest, ASlowSenderIsCutOffAtItsDeadlineAndHoldsUpNoOne) {
  HandoverSocket::Options options = Options();
  options.message_timeout = absl::Milliseconds(600);
  Start(options);
  OwnedFd slow = Connect(socket_->path());
  const absl::Time connected = absl::Now();
  std::thread trickle([fd = slow.get()] {
    const std::string line = std::string(kCudaIpcMessagePrefix) + std::string(400, 'x') + "\n";
    // Bounded: one byte every 20 ms until the server closes the connection (or 5 s pass).
    for (size_t i = 0; i < 250 && i < line.size(); ++i) {
      if (send(fd, &line[i], 1, MSG_NOSIGNAL) != 1) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  OwnedFd lifeline;
  EXPECT_THAT(HandOverMemfd(&lifeline), StartsWith("OK "));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "the hand-over waited for the trickling sender";
  trickle.join();
  const absl::Duration cut_off = absl::Now() - connected;
  EXPECT_THAT(ReadAnswer(slow.get()), StartsWith("ERR DEADLINE_EXCEEDED no whole hand-over message within 600ms"));
  EXPECT_GE(cut_off, absl::Milliseconds(590));
  EXPECT_LT(cut_off, absl::Seconds(3)) << "the trickle went on past its deadline";
  EXPECT_EQ(outcomes(2), (std::vector<std::string>{"staged", "timed_out"}));
  EXPECT_EQ(registry_.pending(), 1);
}

// Connections beyond Options::max_handshakes are answered RESOURCE_EXHAUSTED and closed at once,
// counted as exhausted; when a place frees up, hand-overs go through again.
TEST_F(HandoverConcurrencyTest, ConnectionsBeyondTheBoundAreRefusedWithResourceExhausted) {
  HandoverSocket::Options options = Options();
  options.max_handshakes = 2;
  options.message_timeout = absl::Seconds(20);  // The idle ones stay for the whole test.
  Start(options);
  OwnedFd first = Connect(socket_->path());
  OwnedFd second = Connect(socket_->path());
  OwnedFd third = Connect(socket_->path());
  EXPECT_EQ(ReadAnswer(third.get()),
            "ERR RESOURCE_EXHAUSTED the server is reading 2 hand-overs already (--shm-max-handshakes); send the "
            "message at once after connecting, and try again");
  EXPECT_TRUE(ClosedWithin(third.get(), absl::Seconds(1)));
  // A hand-over that finds no place is refused the same way, its memfd never mapped.
  OwnedFd refused_lifeline;
  EXPECT_THAT(HandOverMemfd(&refused_lifeline), StartsWith("ERR RESOURCE_EXHAUSTED the server is reading 2"));
  EXPECT_EQ(registry_.pending(), 0);
  EXPECT_EQ(outcomes(2), (std::vector<std::string>{"exhausted", "exhausted"}));
  // One idle client goes (its end is a message of nothing): its place is free for the next one.
  first = OwnedFd();
  EXPECT_EQ(outcomes(3).back(), "refused_message");
  OwnedFd lifeline;
  EXPECT_THAT(HandOverMemfd(&lifeline), StartsWith("OK "));
  EXPECT_EQ(registry_.pending(), 1);
}

}  // namespace
}  // namespace orthoserve
