// GlooCollective failures: timeouts, a vanished peer, bad arguments, the broken-after-error
// rule and rendezvous errors. Every wait here is bounded by short timeouts.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/gloo/gloo_collective.h"
#include "server/collective/in_memory_store.h"
#include "tests/util/rank_threads.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::MakeGlooGroup;
using ::orthoserve::testing::RunRanks;
using ::orthoserve::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;

std::vector<std::unique_ptr<Collective>> Group(int world) {
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(world, absl::Seconds(10));
  EXPECT_OK(group);
  return group.ok() ? *std::move(group) : std::vector<std::unique_ptr<Collective>>();
}

absl::StatusCode CodeOf(const absl::Status& status) { return status.code(); }

TEST(GlooFailureTest, MissingRankTimesOutWithinTheTimeoutThenTheGroupIsBroken) {
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<Collective>> group = Group(kWorld);
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  const absl::Duration timeout = absl::Milliseconds(400);
  std::vector<absl::Status> first(kWorld), after(kWorld);
  std::vector<absl::Duration> took(kWorld);
  RunRanks(kWorld, [&](int rank) {
    if (rank == 2) return;  // never calls
    const absl::Time start = absl::Now();
    std::vector<size_t> counts(kWorld, 64);
    std::vector<uint8_t> send(64 * kWorld, 1), recv(64 * kWorld);
    first[rank] = group[rank]->AllToAllv(send.data(), counts, recv.data(), counts, timeout);
    took[rank] = absl::Now() - start;
    after[rank] = group[rank]->Barrier(absl::Seconds(5));
  });
  int deadline_exceeded = 0;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(first[rank], AnyOf(StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("Timed out")),
                                   StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gloo AllToAllv"))));
    deadline_exceeded += CodeOf(first[rank]) == absl::StatusCode::kDeadlineExceeded;
    EXPECT_LT(took[rank], timeout + absl::Milliseconds(1500)) << "rank " << rank;
    EXPECT_THAT(after[rank], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("broken")));
  }
  // Whoever waits longest for rank 2 hits its own deadline first.
  EXPECT_GE(deadline_exceeded, 1);
  // Rank 2's peers have closed their connections: it fails fast instead of waiting 5 s.
  const absl::Time start = absl::Now();
  EXPECT_THAT(group[2]->Barrier(absl::Seconds(5)),
              AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gloo Barrier")),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("gloo Barrier"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(GlooFailureTest, VanishedPeerGivesUnavailableFast) {
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<Collective>> group = Group(kWorld);
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  group[1].reset();  // rank 1's process is gone: its sockets close
  std::vector<absl::Status> result(kWorld);
  std::vector<absl::Duration> took(kWorld);
  RunRanks(kWorld, [&](int rank) {
    if (rank == 1) return;
    const absl::Time start = absl::Now();
    std::vector<float> values(1000, 1.0f);
    result[rank] = group[rank]->AllReduceSum(absl::MakeSpan(values), absl::Seconds(10));
    took[rank] = absl::Now() - start;
  });
  for (int rank : {0, 2}) {
    EXPECT_THAT(result[rank], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gloo AllReduceSum")))
        << "rank " << rank;
    EXPECT_LT(took[rank], absl::Seconds(3)) << "rank " << rank;
    EXPECT_THAT(group[rank]->Barrier(absl::Seconds(1)), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("broken")));
  }
}

TEST(GlooFailureTest, BadArgumentsAreInvalidArgumentAndBreakTheGroup) {
  constexpr int kWorld = 2;
  std::vector<std::unique_ptr<Collective>> group = Group(kWorld);
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  std::vector<absl::Status> result(kWorld), after(kWorld);
  RunRanks(kWorld, [&](int rank) {
    uint8_t byte = 0;
    if (rank == 0) {
      result[rank] = group[rank]->Broadcast(&byte, 1, /*root=*/kWorld, absl::Seconds(5));
    } else {
      const size_t wrong[] = {1, 1, 1};
      uint8_t buf[3] = {};
      result[rank] = group[rank]->AllToAllv(buf, wrong, buf, wrong, absl::Seconds(5));
    }
    after[rank] = group[rank]->AllGatherv(&byte, 1, nullptr, {}, absl::Seconds(5));
  });
  EXPECT_THAT(result[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 2")));
  EXPECT_THAT(result[1], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world = 2")));
  EXPECT_THAT(after[0], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("root 2")));
  EXPECT_THAT(after[1], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("world = 2")));
}

// What rank 1 of a two-rank group saw while rank 0 ran `rank0`: its Barrier's status and how
// long the Barrier took (at most `limit`).
struct PeerBarrier {
  absl::Status status;
  absl::Duration took;
};
PeerBarrier WhileThePeerWaitsInABarrier(absl::Duration limit, const std::function<void(Collective&)>& rank0) {
  std::vector<std::unique_ptr<Collective>> group = Group(2);
  PeerBarrier peer{absl::InternalError("the group was not formed"), absl::ZeroDuration()};
  if (group.size() != 2) return peer;
  RunRanks(2, [&](int rank) {
    if (rank == 0) {
      rank0(*group[0]);
    } else {
      const absl::Time start = absl::Now();
      peer.status = group[1]->Barrier(limit);
      peer.took = absl::Now() - start;
    }
  });
  return peer;
}

TEST(GlooFailureTest, LocalErrorOnOneRankFailsItsPeerPromptly) {
  const PeerBarrier peer = WhileThePeerWaitsInABarrier(absl::Seconds(10), [](Collective& rank0) {
    uint8_t byte = 0;
    EXPECT_THAT(rank0.Broadcast(&byte, 1, -1, absl::Seconds(5)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root -1")));
  });
  EXPECT_THAT(peer.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gloo Barrier")));
  EXPECT_LT(peer.took, absl::Seconds(3));
}

// An abort on a rank that is not inside an operation (it gave up before its next call) closes
// its connections: the peer waiting on it fails at once, and the aborted rank's later calls are
// UNAVAILABLE naming the reason.
TEST(GlooFailureTest, AbortBetweenOperationsFailsTheWaitingPeerPromptly) {
  const PeerBarrier peer = WhileThePeerWaitsInABarrier(absl::Seconds(20), [](Collective& rank0) {
    absl::SleepFor(absl::Milliseconds(200));  // The peer is waiting in its barrier by now.
    rank0.Abort("out of device memory");
    EXPECT_THAT(rank0.Barrier(absl::Seconds(5)),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("out of device memory")));
  });
  EXPECT_EQ(peer.status.code(), absl::StatusCode::kUnavailable) << peer.status;
  EXPECT_LT(peer.took, absl::Seconds(5));
}

TEST(GlooFailureTest, CreateRejectsBadOptions) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  options.world = 2;
  options.rank = 2;
  EXPECT_THAT(GlooCollective::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2")));
  options.rank = 0;
  options.world = 0;
  EXPECT_THAT(GlooCollective::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world")));
  options.world = 1;
  options.store = nullptr;
  EXPECT_THAT(GlooCollective::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("store")));
  options.store = &store;
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(GlooCollective::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  options.timeout = absl::Seconds(1);
  options.hostname = "";
  EXPECT_THAT(GlooCollective::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hostname")));
}

TEST(GlooFailureTest, RendezvousTimesOutNamingTheMissingRanksKey) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  options.world = 2;
  options.rank = 0;
  options.prefix = "gen-7";
  options.timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  EXPECT_THAT(GlooCollective::Create(options),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("gen-7/gloo/1")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // This rank's own address was published under the generation prefix.
  EXPECT_OK(store.Get("gen-7/gloo/0", absl::Milliseconds(1)));
}

TEST(GlooFailureTest, UnknownInterfaceIsInvalidArgument) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  options.interface = "no-such-nic0";
  EXPECT_THAT(GlooCollective::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'no-such-nic0' does not exist")));
}

TEST(GlooFailureTest, UnresolvableHostnameIsRejectedBeforeGlooSeesIt) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  options.hostname = "no-such-host.invalid";
  EXPECT_THAT(GlooCollective::Create(options),
              AnyOf(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'no-such-host.invalid' does not resolve")),
                    StatusIs(absl::StatusCode::kUnavailable, HasSubstr("'no-such-host.invalid' does not resolve"))));
}

TEST(GlooFailureTest, AddressOfAnotherHostIsUnavailableWithGloosMessage) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  options.hostname = "192.0.2.1";  // TEST-NET-1: resolves, but is not an address of this host
  EXPECT_THAT(GlooCollective::Create(options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gloo rendezvous of rank 0 of 1: gloo")));
}

TEST(GlooFailureTest, LoopbackInterfaceWorks) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  options.interface = "lo";
  EXPECT_OK(GlooCollective::Create(options));
}

TEST(GlooFailureTest, SuccessiveGenerationsShareOneStore) {
  // A fleet re-forms under a new prefix on the same store; the old generation's keys stay.
  constexpr int kWorld = 3;
  InMemoryStore store;
  for (const char* generation : {"gen-1", "gen-2"}) {
    std::vector<std::unique_ptr<GlooCollective>> group(kWorld);
    RunRanks(kWorld, [&](int rank) {
      GlooCollective::Options options;
      options.rank = rank;
      options.world = kWorld;
      options.store = &store;
      options.prefix = generation;
      options.timeout = absl::Seconds(10);
      absl::StatusOr<std::unique_ptr<GlooCollective>> made = GlooCollective::Create(options);
      ASSERT_OK(made);
      group[rank] = *std::move(made);
    });
    RunRanks(kWorld, [&](int rank) {
      ASSERT_NE(group[rank], nullptr);
      std::vector<double> v = {static_cast<double>(rank)};
      ASSERT_OK(group[rank]->AllReduceSum(absl::MakeSpan(v), absl::Seconds(10)));
      EXPECT_EQ(v[0], 3.0);
    });
  }
  EXPECT_OK(store.Wait({"gen-1/gloo/0", "gen-1/gloo/2", "gen-2/gloo/1"}, absl::Milliseconds(1)));
}

TEST(GlooFailureTest, WorldOneWorksWithoutPeers) {
  InMemoryStore store;
  GlooCollective::Options options;
  options.store = &store;
  absl::StatusOr<std::unique_ptr<GlooCollective>> solo = GlooCollective::Create(options);
  ASSERT_OK(solo);
  EXPECT_FALSE((*solo)->ReducesDeviceMemory());  // Host memory only.
  std::vector<double> v = {1.25, -3.5};
  ASSERT_OK((*solo)->AllReduceSum(absl::MakeSpan(v), absl::Seconds(1)));
  EXPECT_EQ(v, (std::vector<double>{1.25, -3.5}));
  EXPECT_OK((*solo)->Barrier(absl::Seconds(1)));
}

}  // namespace
}  // namespace orthoserve
