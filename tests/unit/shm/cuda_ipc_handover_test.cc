// The CUDA_IPC message of the handover socket without CUDA: its parsing, and the socket and the
// registry with a fake opener that hands out host memory labelled as a GPU's — what reaches the
// opener, what is refused before it (no opener, too large, a peer not accepted, a broken line),
// tickets, the region's memory in listings, leases and totals, and the memory closed only when
// the last lease goes. The real opener is the CUDA backend's (tests/gpu).
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shm/cuda_ipc_message.h"
#include "server/shm/handover_socket.h"
#include "server/shm/region_registry.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kUuid[] = "GPU-e0e1e2e3-e4e5-e6e7-e8e9-eaebecedee00";

CudaIpcHandover Handover(int64_t offset, int64_t size) {
  CudaIpcHandover h;
  h.device_uuid = kUuid;
  h.offset = offset;
  h.size = size;
  h.handle = std::string(64, '\0');
  for (int i = 0; i < 64; ++i) h.handle[i] = static_cast<char>(i * 7 + 1);
  return h;
}

TEST(CudaIpcMessageTest, FormatAndParseRoundTrip) {
  const CudaIpcHandover h = Handover(512, 1 << 20);
  const std::string line = FormatCudaIpcMessage(h);
  EXPECT_THAT(line, StartsWith(std::string("CUDA_IPC ") + kUuid + " 512 1048576 "));
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.size(), 9 + 40 + 1 + 3 + 1 + 7 + 1 + 128 + 1);
  absl::StatusOr<CudaIpcHandover> parsed = ParseCudaIpcMessage(line);
  ASSERT_OK(parsed.status());
  EXPECT_EQ(parsed->device_uuid, kUuid);
  EXPECT_EQ(parsed->offset, 512);
  EXPECT_EQ(parsed->size, 1 << 20);
  EXPECT_EQ(parsed->handle, h.handle);
}

TEST(CudaIpcMessageTest, MalformedMessagesAreRefusedNamingTheField) {
  const std::string hex = absl::BytesToHexString(Handover(0, 1).handle);
  const std::string uuid = kUuid;
  struct Bad {
    std::string line;
    const char* text;
  };
  const Bad bad[] = {
      {"CUDA_IPC " + uuid + " 0 64\n", "one line"},
      {"CUDA_IPC " + uuid + " 0 64 " + hex + " extra\n", "one line"},
      {"CUDA_IPC  " + uuid + " 0 64 " + hex + "\n", "one line"},
      {"CUDA-IPC " + uuid + " 0 64 " + hex + "\n", "one line"},
      {"CUDA_IPC 0 0 64 " + hex + "\n", "UUID"},
      {"CUDA_IPC GPU-0 0 64 " + hex + "\n", "UUID"},
      {"CUDA_IPC " + uuid + " -256 64 " + hex + "\n", "offset"},
      {"CUDA_IPC " + uuid + " +256 64 " + hex + "\n", "offset"},
      {"CUDA_IPC " + uuid + " 0x10 64 " + hex + "\n", "offset"},
      {"CUDA_IPC " + uuid + " 0 99999999999999999999 " + hex + "\n", "size"},
      {"CUDA_IPC " + uuid + " 0 64 " + hex.substr(2) + "\n", "128 hex digits"},
      {"CUDA_IPC " + uuid + " 0 64 " + hex.substr(2) + "zz\n", "128 hex digits"},
  };
  for (const Bad& b : bad) {
    EXPECT_THAT(ParseCudaIpcMessage(b.line), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.text))) << b.line;
  }
}

// Host memory standing in for an opened GPU allocation; counts the live ones.
class FakeDeviceMemory final : public RegionMemory {
 public:
  FakeDeviceMemory(int64_t size, std::atomic<int>* live) : bytes_(static_cast<size_t>(size)), live_(live) { ++*live_; }
  ~FakeDeviceMemory() override { --*live_; }
  char* data() const override { return const_cast<char*>(bytes_.data()); }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::string cuda_device() const override { return kUuid; }

 private:
  std::vector<char> bytes_;
  std::atomic<int>* live_;
};

class CudaIpcHandoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/orthoserve-shm-ipc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/shm.sock";
  }
  void TearDown() override {
    socket_.reset();
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  // Starts the socket; with an opener that records the requests and opens fake memory unless
  // `refusal` is set (then answers it).
  void Start(bool opener, absl::Status refusal = absl::OkStatus(), std::vector<uid_t> peers = {}) {
    HandoverSocket::Options o;
    o.path = path_;
    o.peer_uids = std::move(peers);
    o.observe = [this](absl::string_view outcome) {
      absl::MutexLock lock(&mu_);
      outcomes_.emplace_back(outcome);
    };
    if (opener) {
      o.open_cuda_ipc = [this, refusal](const CudaIpcHandover& h) -> absl::StatusOr<std::unique_ptr<RegionMemory>> {
        {
          absl::MutexLock lock(&mu_);
          opened_.push_back(h);
        }
        if (!refusal.ok()) return refusal;
        return std::unique_ptr<RegionMemory>(new FakeDeviceMemory(h.size, &live_));
      };
    }
    absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start(o, &registry_);
    ASSERT_OK(socket.status());
    socket_ = *std::move(socket);
  }
  std::vector<std::string> outcomes(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outcomes_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return outcomes_;
  }
  std::vector<CudaIpcHandover> opened() {
    absl::MutexLock lock(&mu_);
    return opened_;
  }

  std::string dir_;
  std::string path_;
  RegionRegistry registry_{RegionRegistry::Options{}};
  std::unique_ptr<HandoverSocket> socket_;
  std::atomic<int> live_{0};
  absl::Mutex mu_;
  std::vector<std::string> outcomes_ ABSL_GUARDED_BY(mu_);
  std::vector<CudaIpcHandover> opened_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CudaIpcHandoverTest, AHandleIsOpenedStagedClaimedAndClosedWhenTheLastLeaseGoes) {
  Start(/*opener=*/true);
  const CudaIpcHandover h = Handover(4096, 1 << 16);
  // The line may arrive in pieces: split inside the handle.
  OwnedFd lifeline;
  const std::string answer = HandOverLine(path_, FormatCudaIpcMessage(h), 100, 50, &lifeline);
  ASSERT_THAT(answer, StartsWith("OK "));
  const std::vector<CudaIpcHandover> got = opened();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].device_uuid, kUuid);
  EXPECT_EQ(got[0].offset, 4096);
  EXPECT_EQ(got[0].size, 1 << 16);
  EXPECT_EQ(got[0].handle, h.handle);
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"staged"});
  EXPECT_EQ(registry_.pending(), 1);

  absl::StatusOr<RegionInfo> info = registry_.Claim("alice", answer.substr(3), "momenta");
  ASSERT_OK(info.status());
  EXPECT_EQ(info->cuda_device, kUuid);
  EXPECT_EQ(info->size, 1 << 16);
  EXPECT_EQ(info->peer.pid, getpid());
  const RegionRegistry::Totals totals = registry_.totals();
  EXPECT_EQ(totals.cuda_regions, 1);
  EXPECT_EQ(totals.cuda_bytes, 1 << 16);
  EXPECT_EQ(totals.host_regions, 0);
  ASSERT_EQ(registry_.List("alice").size(), 1u);
  EXPECT_EQ(registry_.List("alice")[0].cuda_device, kUuid);
  EXPECT_TRUE(registry_.List("mallory").empty());
  EXPECT_THAT(registry_.Use("mallory", info->id, 0, 64), StatusIs(absl::StatusCode::kNotFound, ::testing::_));

  absl::StatusOr<RegionLease> lease = registry_.Use("alice", info->id, 256, 1024);
  ASSERT_OK(lease.status());
  EXPECT_TRUE(lease->on_device());
  EXPECT_THAT(registry_.Use("alice", info->id, (1 << 16) - 8, 16),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  // Unregistered with a lease held: gone from the registry, still open until the lease goes.
  EXPECT_THAT(registry_.Unregister("alice", info->id, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_EQ(live_.load(), 1);
  EXPECT_EQ(registry_.totals().cuda_regions, 0);
  lease->Release();
  EXPECT_EQ(live_.load(), 0);  // Closed with the last lease.
}

TEST_F(CudaIpcHandoverTest, WithoutAnOpenerAHandleIsRefusedWithFailedPrecondition) {
  Start(/*opener=*/false);
  EXPECT_THAT(HandOverLine(path_, FormatCudaIpcMessage(Handover(0, 1024))),
              StartsWith("ERR FAILED_PRECONDITION this server does not open CUDA IPC handles"));
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"refused_cuda_ipc"});
  EXPECT_EQ(registry_.pending(), 0);
  // The socket goes on taking memfds.
  OwnedFd fd = MakeMemfd(1 << 16);
  const int fds[] = {fd.get()};
  EXPECT_THAT(HandOver(path_, fds, 1), StartsWith("OK "));
}

TEST_F(CudaIpcHandoverTest, TheOpenersRefusalIsTheAnswer) {
  Start(/*opener=*/true, absl::FailedPreconditionError("the handle is of device GPU-x, not this server's"));
  EXPECT_EQ(HandOverLine(path_, FormatCudaIpcMessage(Handover(0, 1024))),
            "ERR FAILED_PRECONDITION the handle is of device GPU-x, not this server's");
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"refused_cuda_ipc"});
  EXPECT_EQ(registry_.pending(), 0);
}

TEST_F(CudaIpcHandoverTest, WhatIsRefusedBeforeTheOpenerIsAsked) {
  Start(/*opener=*/true);
  const int64_t too_large = registry_.options().max_region_bytes + 1;
  EXPECT_THAT(HandOverLine(path_, FormatCudaIpcMessage(Handover(0, too_large))),
              StartsWith("ERR OUT_OF_RANGE the region holds"));
  std::string line = FormatCudaIpcMessage(Handover(0, 1024));
  EXPECT_THAT(HandOverLine(path_, line.substr(0, line.size() - 1)),  // No newline: the client stops sending.
              StartsWith("ERR INVALID_ARGUMENT a CUDA_IPC message is one line"));
  EXPECT_THAT(HandOverLine(path_, line + "more"), StartsWith("ERR INVALID_ARGUMENT a CUDA_IPC message is one line"));
  EXPECT_THAT(HandOverLine(path_, "CUDA_IPC GPU-0 0 1024 00\n"), StartsWith("ERR INVALID_ARGUMENT CUDA_IPC message"));
  EXPECT_THAT(HandOverLine(path_, "hello\n"), StartsWith("ERR INVALID_ARGUMENT send one message"));
  EXPECT_EQ(outcomes(5), (std::vector<std::string>{"refused_cuda_ipc", "refused_message", "refused_message",
                                                   "refused_message", "refused_message"}));
  EXPECT_TRUE(opened().empty());
  EXPECT_EQ(registry_.pending(), 0);
}

TEST_F(CudaIpcHandoverTest, APeerWhoseUidIsNotAcceptedIsRefusedBeforeTheOpener) {
  Start(/*opener=*/true, absl::OkStatus(), {geteuid() + 1});
  EXPECT_THAT(HandOverLine(path_, FormatCudaIpcMessage(Handover(0, 1024))), StartsWith("ERR PERMISSION_DENIED uid"));
  EXPECT_EQ(outcomes(1), std::vector<std::string>{"refused_peer"});
  EXPECT_TRUE(opened().empty());
}

}  // namespace
}  // namespace orthoserve
