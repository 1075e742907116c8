// GlooCollective over loopback with ranks as threads, parameterized over world size and data
// sizes: every byte of every exchange is checked, and sums are compared bit for bit with the
// rank-order sum.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/collective.h"
#include "tests/util/rank_threads.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::MakeGlooGroup;
using ::orthoserve::testing::RunRanks;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// Data sizes of a test case.
enum class Sizes { kUneven, kEmpty, kLarge };

std::string SizesName(Sizes sizes) {
  switch (sizes) {
    case Sizes::kUneven:
      return "Uneven";
    case Sizes::kEmpty:
      return "Empty";
    case Sizes::kLarge:
      return "Large";
  }
  return "?";
}

// Bytes rank `from` sends to rank `to`: uneven with some zeros, all zero, or large (several
// socket buffers) and odd.
size_t PairBytes(Sizes sizes, int from, int to) {
  switch (sizes) {
    case Sizes::kUneven:
      return static_cast<size_t>((from * 7 + to * 3) % 5) * 11;  // 0 .. 44, zero for some pairs
    case Sizes::kEmpty:
      return 0;
    case Sizes::kLarge:
      return (from == to ? 3 : (1u << 20) + 17 * from + to);
  }
  return 0;
}

// Bytes rank `rank` contributes to an all-gather.
size_t GatherBytes(Sizes sizes, int rank) {
  static constexpr size_t kUneven[] = {0, 5, 1000, 13};
  switch (sizes) {
    case Sizes::kUneven:
      return kUneven[rank % 4];
    case Sizes::kEmpty:
      return 0;
    case Sizes::kLarge:
      return rank % 2 == 0 ? (3u << 20) + rank : 1;
  }
  return 0;
}

// The `i`-th byte that rank `from` sends to rank `to` (a hash, so misplaced bytes show).
uint8_t PatternByte(int from, int to, size_t i) {
  uint64_t x = (static_cast<uint64_t>(from) * 1000003u + static_cast<uint64_t>(to) * 10007u + i) * 0x9E3779B97F4A7C15u;
  return static_cast<uint8_t>(x >> 56);
}

class GlooCollectiveTest : public ::testing::TestWithParam<std::tuple<int, Sizes>> {
 protected:
  void SetUp() override {
    world_ = std::get<0>(GetParam());
    sizes_ = std::get<1>(GetParam());
    absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(world_, absl::Seconds(20));
    ASSERT_OK(group);
    group_ = *std::move(group);
    for (int r = 0; r < world_; ++r) {
      ASSERT_EQ(group_[r]->rank(), r);
      ASSERT_EQ(group_[r]->world(), world_);
      ASSERT_EQ(group_[r]->name(), "gloo");
    }
  }

  int world_ = 0;
  Sizes sizes_ = Sizes::kUneven;
  std::vector<std::unique_ptr<Collective>> group_;
};

TEST_P(GlooCollectiveTest, AllToAllvDeliversEveryByte) {
  RunRanks(world_, [&](int rank) {
    std::vector<size_t> send_bytes(world_), recv_bytes(world_);
    for (int p = 0; p < world_; ++p) {
      send_bytes[p] = PairBytes(sizes_, rank, p);
      recv_bytes[p] = PairBytes(sizes_, p, rank);
    }
    std::vector<uint8_t> send;
    for (int p = 0; p < world_; ++p) {
      for (size_t i = 0; i < send_bytes[p]; ++i) send.push_back(PatternByte(rank, p, i));
    }
    size_t total = 0;
    for (size_t b : recv_bytes) total += b;
    std::vector<uint8_t> recv(total, 0xAB);
    // Two rounds on the same group: tags and buffers are reused correctly.
    for (int round = 0; round < 2; ++round) {
      std::fill(recv.begin(), recv.end(), 0xAB);
      ASSERT_OK(group_[rank]->AllToAllv(send.data(), send_bytes, recv.data(), recv_bytes, kTimeout));
      size_t offset = 0;
      for (int p = 0; p < world_; ++p) {
        size_t wrong = 0;
        for (size_t i = 0; i < recv_bytes[p]; ++i) wrong += recv[offset + i] != PatternByte(p, rank, i);
        EXPECT_EQ(wrong, 0u) << "rank " << rank << " segment from " << p << " round " << round;
        offset += recv_bytes[p];
      }
    }
  });
}

TEST_P(GlooCollectiveTest, AllGathervCollectsEveryContribution) {
  RunRanks(world_, [&](int rank) {
    std::vector<size_t> recv_bytes(world_);
    size_t total = 0;
    for (int p = 0; p < world_; ++p) total += recv_bytes[p] = GatherBytes(sizes_, p);
    std::vector<uint8_t> send(recv_bytes[rank]);
    for (size_t i = 0; i < send.size(); ++i) send[i] = PatternByte(rank, -1, i);
    std::vector<uint8_t> recv(total, 0xCD);
    ASSERT_OK(group_[rank]->AllGatherv(send.data(), send.size(), recv.data(), recv_bytes, kTimeout));
    // In place: this rank's contribution already sits in its segment of the output.
    std::vector<uint8_t> in_place(total, 0xCD);
    size_t own = 0;
    for (int p = 0; p < rank; ++p) own += recv_bytes[p];
    std::copy(send.begin(), send.end(), in_place.begin() + own);
    ASSERT_OK(group_[rank]->AllGatherv(in_place.data() + own, send.size(), in_place.data(), recv_bytes, kTimeout));
    size_t offset = 0;
    for (int p = 0; p < world_; ++p) {
      size_t wrong = 0, wrong_in_place = 0;
      for (size_t i = 0; i < recv_bytes[p]; ++i) {
        wrong += recv[offset + i] != PatternByte(p, -1, i);
        wrong_in_place += in_place[offset + i] != PatternByte(p, -1, i);
      }
      EXPECT_EQ(wrong, 0u) << "rank " << rank << " contribution of " << p;
      EXPECT_EQ(wrong_in_place, 0u) << "rank " << rank << " contribution of " << p << " (in place)";
      offset += recv_bytes[p];
    }
  });
}

// Values whose sum depends on the order of addition: wide magnitudes, mixed signs.
template <typename T>
std::vector<T> Contribution(int rank, size_t n) {
  std::mt19937_64 rng(1234 + rank);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<T> values(n);
  for (T& v : values) v = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  return values;
}

size_t ReduceCount(Sizes sizes, int world) {
  switch (sizes) {
    case Sizes::kUneven:
      return 1001;
    case Sizes::kEmpty:
      return world - 1;  // fewer elements than ranks: some ranks own no slice (or n = 0)
    case Sizes::kLarge:
      return (1u << 20) + 3;
  }
  return 0;
}

template <typename T>
void CheckAllReduceSum(std::vector<std::unique_ptr<Collective>>& group, size_t n) {
  const int world = static_cast<int>(group.size());
  std::vector<std::vector<T>> inputs(world);
  for (int r = 0; r < world; ++r) inputs[r] = Contribution<T>(r, n);
  // Reference: ((v0 + v1) + v2) + ..., element by element.
  std::vector<T> expected = inputs[0];
  for (int r = 1; r < world; ++r) {
    for (size_t e = 0; e < n; ++e) expected[e] += inputs[r][e];
  }
  if (world >= 3 && n >= 1000) {
    // The data is order-sensitive: reverse order changes some element, so the bitwise check
    // below really pins the order.
    size_t differ = 0;
    for (size_t e = 0; e < n; ++e) {
      T reversed = inputs[world - 1][e];
      for (int r = world - 2; r >= 0; --r) reversed += inputs[r][e];
      differ += reversed != expected[e];
    }
    ASSERT_GT(differ, 0u);
  }
  std::vector<std::vector<T>> results = inputs;
  RunRanks(world, [&](int rank) { ASSERT_OK(group[rank]->AllReduceSum(absl::MakeSpan(results[rank]), kTimeout)); });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(results[r].size(), n);
    EXPECT_TRUE(n == 0 || std::memcmp(results[r].data(), expected.data(), n * sizeof(T)) == 0)
        << "rank " << r << " differs from the rank-order sum";
  }
}

TEST_P(GlooCollectiveTest, AllReduceSumFloatIsTheRankOrderSumOnEveryRank) {
  CheckAllReduceSum<float>(group_, ReduceCount(sizes_, world_));
}

TEST_P(GlooCollectiveTest, AllReduceSumDoubleIsTheRankOrderSumOnEveryRank) {
  CheckAllReduceSum<double>(group_, ReduceCount(sizes_, world_));
}

TEST_P(GlooCollectiveTest, BroadcastFromEveryRoot) {
  RunRanks(world_, [&](int rank) {
    for (int root = 0; root < world_; ++root) {
      const size_t bytes = sizes_ == Sizes::kEmpty ? 0 : sizes_ == Sizes::kLarge ? (2u << 20) + root : 100 + 17 * root;
      std::vector<uint8_t> data(bytes);
      for (size_t i = 0; i < bytes; ++i) data[i] = rank == root ? PatternByte(root, 99, i) : 0xEE;
      ASSERT_OK(group_[rank]->Broadcast(data.data(), bytes, root, kTimeout));
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i) wrong += data[i] != PatternByte(root, 99, i);
      EXPECT_EQ(wrong, 0u) << "rank " << rank << " root " << root;
    }
  });
}

TEST_P(GlooCollectiveTest, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  RunRanks(world_, [&](int rank) {
    for (int round = 1; round <= 3; ++round) {
      // Late arrivals: rank r enters r * 20 ms after rank 0.
      absl::SleepFor(absl::Milliseconds(20 * rank));
      arrived.fetch_add(1);
      ASSERT_OK(group_[rank]->Barrier(kTimeout));
      // Every rank has arrived `round` times before anyone leaves barrier `round`.
      EXPECT_GE(arrived.load(), round * world_) << "rank " << rank << " left barrier " << round << " early";
    }
  });
}

TEST_P(GlooCollectiveTest, MixedOperationsInSequence) {
  RunRanks(world_, [&](int rank) {
    for (int step = 0; step < 5; ++step) {
      std::vector<double> v = {static_cast<double>(rank + step), 1.0};
      ASSERT_OK(group_[rank]->AllReduceSum(absl::MakeSpan(v), kTimeout));
      EXPECT_EQ(v[0], world_ * (world_ - 1) / 2.0 + world_ * step);
      EXPECT_EQ(v[1], world_);
      std::vector<size_t> counts(world_, 1);
      std::vector<uint8_t> send(world_), recv(world_);
      for (int p = 0; p < world_; ++p) send[p] = static_cast<uint8_t>(rank * 16 + p + step);
      ASSERT_OK(group_[rank]->AllToAllv(send.data(), counts, recv.data(), counts, kTimeout));
      for (int p = 0; p < world_; ++p) EXPECT_EQ(recv[p], static_cast<uint8_t>(p * 16 + rank + step));
      ASSERT_OK(group_[rank]->Barrier(kTimeout));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCollectiveTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Sizes::kUneven, Sizes::kEmpty, Sizes::kLarge)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Sizes>>& info) {
                           return absl::StrCat("World", std::get<0>(info.param), SizesName(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace orthoserve
