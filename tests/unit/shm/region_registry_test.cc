// RegionRegistry and MappedRegion: the checks on a handed-over memfd, tenant isolation, bounds
// and unregister waiting for the steps that use a region. No socket, no server.
#include "server/shm/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shm/mapped_region.h"
#include "server/shm/random_id.h"
#include "tests/unit/shm/memfd_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::_;

constexpr int64_t kSize = 1 << 16;

// A lifeline id not used before in this process (the socket numbers its connections so).
uint64_t NextLifeline() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

std::unique_ptr<MappedRegion> MapOrDie(OwnedFd fd, int64_t max_bytes = kSize) {
  absl::StatusOr<std::unique_ptr<MappedRegion>> region = MappedRegion::Map(fd.release(), max_bytes);
  EXPECT_TRUE(region.ok()) << region.status();
  return region.ok() ? *std::move(region) : nullptr;
}

// Registers a fresh sealed memfd of `size` bytes for `tenant`; returns its info.
RegionInfo Register(RegionRegistry& registry, const std::string& tenant, int64_t size = kSize) {
  absl::StatusOr<std::string> ticket = registry.Stage(MapOrDie(MakeMemfd(size), size), PeerIdentity{}, NextLifeline());
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  absl::StatusOr<RegionInfo> info = registry.Claim(tenant, ticket.value_or(""), "weights");
  EXPECT_TRUE(info.ok()) << info.status();
  return info.value_or(RegionInfo{});
}

TEST(RandomIdTest, IdsAre128BitHexAndDiffer) {
  absl::StatusOr<std::string> a = RandomId128();
  absl::StatusOr<std::string> b = RandomId128();
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  EXPECT_EQ(a->size(), kRandomIdChars);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos) << *a;
  EXPECT_NE(*a, *b);
}

TEST(MappedRegionTest, MapsASealedMemfdShared) {
  OwnedFd fd = MakeMemfd(kSize);
  void* client = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(client, MAP_FAILED);
  const int dup_fd = dup(fd.get());
  std::unique_ptr<MappedRegion> region = MapOrDie(OwnedFd(dup_fd));
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(region->size(), kSize);
  std::memcpy(region->data() + 100, "server", 6);
  EXPECT_EQ(std::memcmp(static_cast<char*>(client) + 100, "server", 6), 0);  // The same pages.
  munmap(client, kSize);
}

TEST(MappedRegionTest, RefusesAMemfdNotSealedAgainstShrinking) {
  EXPECT_THAT(MappedRegion::Map(MakeMemfd(kSize, /*seal_shrink=*/false).release(), kSize),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F_SEAL_SHRINK")));
}

TEST(MappedRegionTest, RefusesAFileThatIsNotAMemfd) {
  char path[] = "/tmp/orthoserve-shm-test-XXXXXX";
  OwnedFd fd(mkstemp(path));
  ASSERT_GE(fd.get(), 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd.get(), kSize), 0);
  EXPECT_THAT(MappedRegion::Map(fd.release(), kSize), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memfd")));
  EXPECT_THAT(MappedRegion::Map(-1, kSize), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no file")));
}

TEST(MappedRegionTest, RefusesEmptyTooLargeAndReadOnlyMemfds) {
  EXPECT_THAT(MappedRegion::Map(MakeMemfd(0).release(), kSize),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("empty")));
  EXPECT_THAT(MappedRegion::Map(MakeMemfd(kSize + 1).release(), kSize),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("--shm-max-region-bytes")));
  OwnedFd fd = MakeMemfd(kSize);
  OwnedFd read_only(open(("/proc/self/fd/" + std::to_string(fd.get())).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(read_only.get(), 0);
  EXPECT_THAT(MappedRegion::Map(read_only.release(), kSize),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reading and writing")));
}

TEST(MappedRegionTest, TheClientCannotTruncateARegionTheServerMapped) {
  OwnedFd fd = MakeMemfd(kSize);
  std::unique_ptr<MappedRegion> region = MapOrDie(OwnedFd(dup(fd.get())));
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(ftruncate(fd.get(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  // The seal cannot be taken away either: F_SEAL_SHRINK stays.
  EXPECT_NE(fcntl(fd.get(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
  // Every page is still there: touching the last byte does not raise SIGBUS.
  region->data()[kSize - 1] = 7;
  EXPECT_EQ(region->data()[kSize - 1], 7);
}

TEST(RegionRegistryTest, ATicketIsGoodForOneClaim) {
  RegionRegistry registry({});
  absl::StatusOr<std::string> ticket = registry.Stage(MapOrDie(MakeMemfd(kSize)), PeerIdentity{42, 1000, 1000}, NextLifeline());
  ASSERT_OK(ticket.status());
  EXPECT_EQ(registry.pending(), 1);
  absl::StatusOr<RegionInfo> info = registry.Claim("alice", *ticket, "momenta");
  ASSERT_OK(info.status());
  EXPECT_EQ(info->id.size(), kRandomIdChars);
  EXPECT_NE(info->id, *ticket);
  EXPECT_EQ(info->name, "momenta");
  EXPECT_EQ(info->size, kSize);
  EXPECT_EQ(info->peer.pid, 42);
  EXPECT_EQ(registry.pending(), 0);
  EXPECT_EQ(registry.regions(), 1);
  EXPECT_EQ(registry.bytes(), kSize);
  EXPECT_THAT(registry.Claim("alice", *ticket, "again"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("ticket")));
  EXPECT_THAT(registry.Claim("mallory", *ticket, "steal"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("ticket")));
}

TEST(RegionRegistryTest, AnUnclaimedTicketExpires) {
  absl::Time now = absl::UnixEpoch();
  RegionRegistry::Options options;
  options.ticket_timeout = absl::Seconds(10);
  options.now = [&now] { return now; };
  RegionRegistry registry(options);
  absl::StatusOr<std::string> ticket = registry.Stage(MapOrDie(MakeMemfd(kSize)), PeerIdentity{}, NextLifeline());
  ASSERT_OK(ticket.status());
  now += absl::Seconds(9);
  EXPECT_EQ(registry.PruneExpired(), 0);
  now += absl::Seconds(1);
  EXPECT_EQ(registry.PruneExpired(), 1);
  EXPECT_EQ(registry.pending(), 0);
  EXPECT_THAT(registry.Claim("alice", *ticket, ""), StatusIs(absl::StatusCode::kNotFound, HasSubstr("expired")));
}

TEST(RegionRegistryTest, StagedMemfdsAndRegionsPerTenantAreBounded) {
  RegionRegistry::Options options;
  options.max_pending = 2;
  options.max_regions_per_tenant = 1;
  RegionRegistry registry(options);
  absl::StatusOr<std::string> first = registry.Stage(MapOrDie(MakeMemfd(kSize)), PeerIdentity{}, NextLifeline());
  ASSERT_OK(first.status());
  absl::StatusOr<std::string> second = registry.Stage(MapOrDie(MakeMemfd(kSize)), PeerIdentity{}, NextLifeline());
  ASSERT_OK(second.status());
  EXPECT_THAT(registry.Stage(MapOrDie(MakeMemfd(kSize)), PeerIdentity{}, NextLifeline()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--shm-max-pending")));
  EXPECT_EQ(registry.pending(), 2);
  ASSERT_OK(registry.Claim("alice", *first, "").status());
  EXPECT_THAT(registry.Claim("alice", *second, ""),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--shm-max-regions-per-tenant")));
  EXPECT_OK(registry.Claim("bob", *second, "").status());  // The ticket stayed good.
  EXPECT_THAT(registry.Claim("bob", "", std::string(2000, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("name")));
}

TEST(RegionRegistryTest, AnotherTenantCannotNameListOrUseARegion) {
  RegionRegistry registry({});
  const RegionInfo alice = Register(registry, "alice");
  EXPECT_OK(registry.Use("alice", alice.id, 0, kSize).status());
  EXPECT_THAT(registry.Use("mallory", alice.id, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  EXPECT_TRUE(registry.List("mallory").empty());
  EXPECT_THAT(registry.Unregister("mallory", alice.id, absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  // Guessing: a thousand random ids, and near misses of the real one, are all NOT_FOUND.
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> guess = RandomId128();
    ASSERT_OK(guess.status());
    EXPECT_THAT(registry.Use("mallory", *guess, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
    EXPECT_THAT(registry.Use("alice", *guess, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  }
  std::string near = alice.id;
  near.back() = near.back() == '0' ? '1' : '0';
  EXPECT_THAT(registry.Use("alice", near, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  ASSERT_EQ(registry.List("alice").size(), 1u);
  EXPECT_EQ(registry.List("alice")[0].id, alice.id);
  // After its owner unregistered it, nobody can use it, the owner included.
  EXPECT_OK(registry.Unregister("alice", alice.id, absl::Now() + absl::Seconds(1)));
  EXPECT_THAT(registry.Use("alice", alice.id, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  EXPECT_THAT(registry.Use("mallory", alice.id, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  EXPECT_EQ(registry.regions(), 0);
  EXPECT_EQ(registry.bytes(), 0);
}

TEST(RegionRegistryTest, SlicesOutsideTheRegionAreRefusedWithoutOverflow) {
  RegionRegistry registry({});
  const RegionInfo r = Register(registry, "alice");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const std::pair<int64_t, int64_t> bad[] = {{-1, 1},    {0, -1},   {kSize, 1},     {kSize + 1, 0},
                                             {1, kSize}, {kMax, 1}, {1, kMax},      {kMax, kMax},
                                             {kMin, 1},  {8, kMin}, {kSize - 1, 2}, {kMax - 4, 8}};
  for (const auto& [offset, size] : bad) {
    EXPECT_THAT(registry.Use("alice", r.id, offset, size), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("inside")))
        << offset << " +" << size;
  }
  absl::StatusOr<RegionLease> whole = registry.Use("alice", r.id, 0, kSize);
  ASSERT_OK(whole.status());
  absl::StatusOr<RegionLease> tail = registry.Use("alice", r.id, kSize - 8, 8);
  ASSERT_OK(tail.status());
  EXPECT_EQ(tail->data(), whole->data() + kSize - 8);
  EXPECT_OK(registry.Use("alice", r.id, kSize, 0).status());  // An empty slice at the end.
}

TEST(RegionRegistryTest, UnregisterWaitsForTheStepsUsingTheRegion) {
  RegionRegistry registry({});
  const RegionInfo r = Register(registry, "alice");
  absl::StatusOr<RegionLease> lease = registry.Use("alice", r.id, 0, kSize);
  ASSERT_OK(lease.status());
  EXPECT_EQ(registry.List("alice")[0].users, 1);
  absl::Notification unregistered;
  absl::Status status;
  const absl::Time start = absl::Now();
  absl::Duration waited;
  std::thread unregister([&] {
    status = registry.Unregister("alice", r.id, absl::Now() + absl::Seconds(10));
    waited = absl::Now() - start;
    unregistered.Notify();
  });
  // The step goes on: its memory is still mapped, and the unregister waits for it.
  EXPECT_FALSE(unregistered.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  lease->data()[0] = 1;
  // New uses are refused at once.
  EXPECT_THAT(registry.Use("alice", r.id, 0, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no shared")));
  lease->Release();
  ASSERT_TRUE(unregistered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  unregister.join();
  EXPECT_OK(status);
  EXPECT_GE(waited, absl::Milliseconds(300));
}

TEST(RegionRegistryTest, UnregisterGivesUpAtItsDeadlineAndTheMemoryStaysForTheStep) {
  RegionRegistry registry({});
  const RegionInfo r = Register(registry, "alice");
  absl::StatusOr<RegionLease> lease = registry.Use("alice", r.id, 0, kSize);
  ASSERT_OK(lease.status());
  EXPECT_THAT(registry.Unregister("alice", r.id, absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 step(s)")));
  EXPECT_TRUE(registry.List("alice").empty());
  lease->data()[kSize - 1] = 3;  // Still mapped while the lease is held.
  EXPECT_EQ(lease->data()[kSize - 1], 3);
  RegionLease moved = *std::move(lease);
  EXPECT_EQ(moved.size(), kSize);
}

TEST(RegionRegistryTest, ALeaseHoldsItsCallUntilReleasedAndAFencedCallLeasesNothing) {
  RegionRegistry registry({});
  const RegionInfo r = Register(registry, "alice");
  absl::StatusOr<RegionLease> lease = registry.Use("alice", r.id, 0, 64, "call-1");
  ASSERT_OK(lease.status());
  EXPECT_EQ(registry.fences().holds("alice", "call-1"), 1);
  RegionLease moved = *std::move(lease);  // Moving a lease moves its hold.
  EXPECT_EQ(registry.fences().holds("alice", "call-1"), 1);
  EXPECT_THAT(registry.FenceCall("alice", "call-1", absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  // A late message of the fenced call takes nothing, whatever it names (a good slice included).
  EXPECT_THAT(registry.Use("alice", r.id, 64, 64, "call-1"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fenced")));
  EXPECT_OK(registry.Use("alice", r.id, 64, 64, "call-2").status());
  moved.Release();
  EXPECT_OK(registry.FenceCall("alice", "call-1", absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(registry.List("alice")[0].users, 0);
}

TEST(RegionRegistryTest, OneMemfdRegisteredTwiceIsOneMemoryAndTwoMemfdsAreTwo) {
  RegionRegistry registry({});
  OwnedFd fd = MakeMemfd(kSize);
  const int copy = dup(fd.get());
  auto stage = [&](int raw) {
    absl::StatusOr<std::string> ticket = registry.Stage(MapOrDie(OwnedFd(raw)), PeerIdentity{}, NextLifeline());
    EXPECT_OK(ticket.status());
    absl::StatusOr<RegionInfo> info = registry.Claim("alice", ticket.value_or(""), "twice");
    EXPECT_OK(info.status());
    return info.value_or(RegionInfo{});
  };
  const RegionInfo a = stage(fd.release());
  const RegionInfo b = stage(copy);
  const RegionInfo other = Register(registry, "alice");
  absl::StatusOr<RegionLease> in_a = registry.Use("alice", a.id, 4096, 128);
  absl::StatusOr<RegionLease> in_b = registry.Use("alice", b.id, 4096 + 64, 128);
  absl::StatusOr<RegionLease> in_other = registry.Use("alice", other.id, 4096, 128);
  ASSERT_OK(in_a.status());
  ASSERT_OK(in_b.status());
  ASSERT_OK(in_other.status());
  EXPECT_NE(in_a->data(), in_b->data() - 64);  // Two mappings of one memfd: the addresses differ,
  EXPECT_TRUE(in_a->span().memory.known());
  EXPECT_EQ(in_a->span().memory, in_b->span().memory);  // but the memory is one,
  EXPECT_TRUE(in_a->span().Overlaps(in_b->span()));
  EXPECT_EQ(in_a->span().offset, 4096);
  EXPECT_NE(in_a->span().memory, in_other->span().memory);  // and another memfd's is not.
  EXPECT_FALSE(in_a->span().Overlaps(in_other->span()));
}

}  // namespace
}  // namespace orthoserve
