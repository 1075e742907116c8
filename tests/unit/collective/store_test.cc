// Tests of InMemoryStore and PrefixStore: blocking Get/Wait with timeouts, atomic Add, scoping.
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/in_memory_store.h"
#include "server/collective/prefix_store.h"
#include "tests/util/rank_threads.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::RunRanks;
using ::orthoserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(InMemoryStoreTest, GetReturnsWhatWasSet) {
  InMemoryStore store;
  ASSERT_OK(store.Set("a", std::string("x\0y", 3)));
  absl::StatusOr<std::string> value = store.Get("a", absl::Seconds(1));
  ASSERT_OK(value);
  EXPECT_EQ(*value, std::string("x\0y", 3));
  ASSERT_OK(store.Set("a", "overwritten"));
  EXPECT_EQ(*store.Get("a", absl::Seconds(1)), "overwritten");
}

TEST(InMemoryStoreTest, GetTimesOutNamingTheKey) {
  InMemoryStore store;
  ASSERT_OK(store.Set("present", "1"));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store.Get("absent-key", absl::Milliseconds(150));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_THAT(value, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("'absent-key'")));
  EXPECT_GE(waited, absl::Milliseconds(140));
  EXPECT_LT(waited, absl::Seconds(2));
}

TEST(InMemoryStoreTest, GetBlocksUntilAnotherThreadSets) {
  InMemoryStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_OK(store.Set("late", "value"));
  });
  absl::StatusOr<std::string> value = store.Get("late", absl::Seconds(5));
  setter.join();
  ASSERT_OK(value);
  EXPECT_EQ(*value, "value");
}

TEST(InMemoryStoreTest, AddStartsAtZeroAndIsAtomicAcrossThreads) {
  InMemoryStore store;
  absl::StatusOr<int64_t> first = store.Add("counter", 5);
  ASSERT_OK(first);
  EXPECT_EQ(*first, 5);
  EXPECT_EQ(*store.Add("counter", -7), -2);
  EXPECT_EQ(*store.Get("counter", absl::Seconds(1)), "-2");

  constexpr int kThreads = 4;
  constexpr int kAdds = 500;
  std::mutex mu;
  std::multiset<int64_t> seen;
  RunRanks(kThreads, [&](int rank) {
    for (int i = 0; i < kAdds; ++i) {
      absl::StatusOr<int64_t> v = store.Add("shared", 1);
      ASSERT_OK(v);
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(*v);
    }
  });
  // Every new value was returned exactly once: 1, 2, ..., kThreads * kAdds.
  ASSERT_EQ(seen.size(), static_cast<size_t>(kThreads * kAdds));
  int64_t expected = 1;
  for (int64_t v : seen) EXPECT_EQ(v, expected++);
}

TEST(InMemoryStoreTest, AddOnNonIntegerIsFailedPrecondition) {
  InMemoryStore store;
  ASSERT_OK(store.Set("text", "hello"));
  EXPECT_THAT(store.Add("text", 1), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'text'")));
  EXPECT_EQ(*store.Get("text", absl::Seconds(1)), "hello");
}

TEST(InMemoryStoreTest, WaitReturnsWhenAllKeysExist) {
  InMemoryStore store;
  ASSERT_OK(store.Set("k0", ""));
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_OK(store.Set("k1", "v"));
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_OK(store.Add("k2", 1).status());
  });
  EXPECT_OK(store.Wait({"k0", "k1", "k2"}, absl::Seconds(5)));
  setter.join();
  EXPECT_OK(store.Wait({}, absl::Milliseconds(1)));
}

TEST(InMemoryStoreTest, WaitTimesOutNamingOnlyMissingKeys) {
  InMemoryStore store;
  ASSERT_OK(store.Set("here", "1"));
  EXPECT_THAT(store.Wait({"here", "missing-a", "missing-b"}, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("'missing-a'"), HasSubstr("'missing-b'"), Not(HasSubstr("'here'")))));
}

TEST(PrefixStoreTest, ScopesKeysInTheBaseStore) {
  InMemoryStore base;
  PrefixStore gen3(&base, "gen-3");
  PrefixStore gen4(&base, "gen-4");
  ASSERT_OK(gen3.Set("addr", "A"));
  ASSERT_OK(gen4.Set("addr", "B"));
  EXPECT_EQ(*base.Get("gen-3/addr", absl::Seconds(1)), "A");
  EXPECT_EQ(*gen4.Get("addr", absl::Seconds(1)), "B");
  EXPECT_EQ(*gen3.Add("n", 2), 2);
  EXPECT_EQ(*base.Get("gen-3/n", absl::Seconds(1)), "2");
  EXPECT_OK(gen3.Wait({"addr", "n"}, absl::Seconds(1)));
  EXPECT_THAT(gen4.Wait({"n"}, absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("'gen-4/n'")));
  EXPECT_THAT(gen4.Get("n", absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("'gen-4/n'")));
}

}  // namespace
}  // namespace orthoserve
