// HandoverSocket over a real Unix domain socket: what a client may hand over and what is
// refused, the peer check, and the socket file's clean-up on start and exit.
#include "server/shm/handover_socket.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shm/random_id.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kSize = 1 << 16;

class HandoverSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/orthoserve-shm-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/shm.sock";
  }
  void TearDown() override {
    unlink(path_.c_str());
    unlink((dir_ + "/plain").c_str());
    rmdir(dir_.c_str());
  }

  HandoverSocket::Options Options() {
    HandoverSocket::Options o;
    o.path = path_;
    o.observe = [this](absl::string_view outcome) {
      absl::MutexLock lock(&mu_);
      outcomes_.emplace_back(outcome);
    };
    return o;
  }
  // The outcomes observed, once there are `count` of them (the socket reports one after it
  // answered the client), or what there is after 10 s.
  std::vector<std::string> outcomes(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outcomes_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return outcomes_;
  }
  bool Exists() {
    struct stat st;
    return lstat(path_.c_str(), &st) == 0;
  }

  std::string dir_;
  std::string path_;
  absl::Mutex mu_;
  std::vector<std::string> outcomes_ ABSL_GUARDED_BY(mu_);
};

TEST_F(HandoverSocketTest, AHandedOverMemfdIsStagedUnderATicket) {
  RegionRegistry registry({});
  absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(Options(), &registry);
  ASSERT_OK(socket.status());
  OwnedFd fd = MakeMemfd(kSize);
  const int fds[] = {fd.get()};
  OwnedFd lifeline;
  const std::string answer = HandOver(path_, fds, 1, &lifeline);
  ASSERT_THAT(answer, StartsWith("OK "));
  const std::string ticket = answer.substr(3);
  EXPECT_EQ(ticket.size(), kRandomIdChars);
  absl::StatusOr<RegionInfo> info = registry.Claim("alice", ticket, "m");
  ASSERT_OK(info.status());
  EXPECT_EQ(info->size, kSize);
  EXPECT_EQ(info->peer.uid, geteuid());
  EXPECT_EQ(info->peer.pid, getpid());
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"staged"});
}

TEST_F(HandoverSocketTest, BadMessagesAreRefusedAndTheSocketGoesOn) {
  RegionRegistry registry({});
  absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(Options(), &registry);
  ASSERT_OK(socket.status());
  OwnedFd unsealed = MakeMemfd(kSize, /*seal_shrink=*/false);
  OwnedFd a = MakeMemfd(kSize);
  OwnedFd b = MakeMemfd(kSize);
  const int one_unsealed[] = {unsealed.get()};
  const int two[] = {a.get(), b.get()};
  EXPECT_THAT(HandOver(path_, nullptr, 0), StartsWith("ERR INVALID_ARGUMENT send one message"));
  EXPECT_THAT(HandOver(path_, two, 2), StartsWith("ERR INVALID_ARGUMENT send one message"));
  EXPECT_THAT(HandOver(path_, one_unsealed, 1), StartsWith("ERR INVALID_ARGUMENT the memfd is not sealed"));
  const int good[] = {a.get()};
  OwnedFd lifeline;
  EXPECT_THAT(HandOver(path_, good, 1, &lifeline), StartsWith("OK "));
  EXPECT_EQ(outcomes(4), (std::vector<std::string>{"refused_message", "refused_message", "refused_memfd", "staged"}));
  EXPECT_EQ(registry.pending(), 1);
}

TEST_F(HandoverSocketTest, APeerWhoseUidIsNotAcceptedIsRefused) {
  RegionRegistry registry({});
  HandoverSocket::Options options = Options();
  options.peer_uids = {geteuid() + 1};
  absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(options, &registry);
  ASSERT_OK(socket.status());
  OwnedFd fd = MakeMemfd(kSize);
  const int fds[] = {fd.get()};
  EXPECT_THAT(HandOver(path_, fds, 1), StartsWith("ERR PERMISSION_DENIED uid"));
  EXPECT_EQ(registry.pending(), 0);
}

TEST_F(HandoverSocketTest, TheSocketFileIsCleanedUpOnStartAndExit) {
  RegionRegistry registry({});
  {
    // A stale socket nobody answers on (a crashed server's) is replaced.
    const int stale = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(stale);
  }
  ASSERT_TRUE(Exists());
  {
    absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(Options(), &registry);
    ASSERT_OK(socket.status());
    struct stat st;
    ASSERT_EQ(lstat(path_.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u);
    // A second server on the same path is refused: the first one answers there.
    EXPECT_THAT(HandoverSocket::Start(Options(), &registry),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another process")));
  }
  EXPECT_FALSE(Exists());
}

TEST_F(HandoverSocketTest, PathsThatAreNotForItAreRefused) {
  RegionRegistry registry({});
  const std::string plain = dir_ + "/plain";
  std::ofstream(plain) << "TOKEN tenant\n";
  HandoverSocket::Options options = Options();
  options.path = plain;
  EXPECT_THAT(HandoverSocket::Start(options, &registry),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a socket")));
  options.reserved_paths = {plain};
  EXPECT_THAT(HandoverSocket::Start(options, &registry),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("uses itself")));
  options.path = "relative.sock";
  EXPECT_THAT(HandoverSocket::Start(options, &registry),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("absolute")));
  options.path = "/" + std::string(200, 'x');
  EXPECT_THAT(HandoverSocket::Start(options, &registry),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("longer")));
  // The plain file is left as it was.
  std::ifstream in(plain);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "TOKEN tenant");
}

}  // namespace
}  // namespace orthoserve
