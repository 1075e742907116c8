// common/fair_pool.h: weighted fair order between tenants, equal shares between the jobs of a
// tenant, costs, priority classes, no credit for idle time, and the shutdown contract. One
// worker, held at a gate while closures queue, makes the dispatch order observable.
#include "common/fair_pool.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoserve {
namespace {

using ::testing::ElementsAre;

// Runs `add` against a fresh one-worker pool held at a gate and returns the dispatch order.
std::vector<std::string> Order(const FairPool::Shares& shares,
                               const std::function<void(const std::function<void(const std::string&, const std::string&,
                                                                                  double, const std::string&)>&)>& add) {
  std::mutex mu;
  std::vector<std::string> order;
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  {
    FairPool pool(1, shares);
    pool.Schedule([open] { open.wait(); });
    add([&](const std::string& tenant, const std::string& job, double cost, const std::string& label) {
      pool.Schedule(tenant, job, cost, [&mu, &order, label] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(label);
      });
    });
    gate.set_value();
  }  // The destructor runs everything queued, then joins.
  return order;
}

TEST(FairPoolTest, EqualTenantsAlternateWhateverTheArrivalOrder) {
  std::vector<std::string> order = Order({}, [](const auto& add) {
    for (int i = 0; i < 4; ++i) add("a", "j", 1, "a" + std::to_string(i));
    for (int i = 0; i < 2; ++i) add("b", "j", 1, "b" + std::to_string(i));
  });
  EXPECT_THAT(order, ElementsAre("a0", "b0", "a1", "b1", "a2", "a3"));
}

TEST(FairPoolTest, WeightsSetTheShares) {
  std::vector<std::string> order = Order({{"a", {3.0, 0}}}, [](const auto& add) {
    for (int i = 0; i < 9; ++i) add("a", "j", 1, "a");
    for (int i = 0; i < 9; ++i) add("b", "j", 1, "b");
  });
  // While both are backlogged, a gets three closures for each of b's.
  EXPECT_THAT(std::vector<std::string>(order.begin(), order.begin() + 8),
              ElementsAre("a", "a", "a", "b", "a", "a", "a", "b"));
}

TEST(FairPoolTest, CostsAreChargedSoCheapWorkIsNotStuckBehindExpensiveWork) {
  std::vector<std::string> order = Order({}, [](const auto& add) {
    for (int i = 0; i < 3; ++i) add("heavy", "j", 4, "H");
    for (int i = 0; i < 8; ++i) add("light", "j", 1, "l");
  });
  // Finish tags: H at 4, 8, 12; l at 1, 2, 3, ... (ties to the earlier scheduled).
  EXPECT_THAT(order, ElementsAre("l", "l", "l", "H", "l", "l", "l", "l", "H", "l", "H"));
}

TEST(FairPoolTest, JobsOfATenantShareItsPartEqually) {
  std::vector<std::string> order = Order({}, [](const auto& add) {
    for (int i = 0; i < 4; ++i) add("a", "big", 1, "a/big");
    for (int i = 0; i < 2; ++i) add("a", "small", 1, "a/small");
    for (int i = 0; i < 4; ++i) add("b", "j", 1, "b");
  });
  // Tenants alternate; within a, its two jobs alternate while both have work.
  EXPECT_THAT(order, ElementsAre("a/big", "b", "a/small", "b", "a/big", "b", "a/small", "b", "a/big", "a/big"));
}

TEST(FairPoolTest, AHigherPriorityClassRunsFirst) {
  std::vector<std::string> order = Order({{"urgent", {1.0, 1}}}, [](const auto& add) {
    for (int i = 0; i < 3; ++i) add("bulk", "j", 1, "bulk");
    add("urgent", "j", 100, "urgent");
  });
  EXPECT_THAT(order, ElementsAre("urgent", "bulk", "bulk", "bulk"));
}

TEST(FairPoolTest, IdleTimeEarnsNoCredit) {
  // a runs alone for a while; when b arrives it gets its share from then on, not a burst that
  // makes up for the time it was idle.
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](const std::string& label) {
    return [&mu, &order, label] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(label);
    };
  };
  FairPool pool(1);
  for (int i = 0; i < 6; ++i) pool.Schedule("a", "j", 1, record("a"));
  while (true) {
    std::lock_guard<std::mutex> lock(mu);
    if (order.size() == 6) break;
  }
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  pool.Schedule([open] { open.wait(); });
  for (int i = 0; i < 3; ++i) pool.Schedule("b", "j", 1, record("b"));
  for (int i = 0; i < 3; ++i) pool.Schedule("a", "j", 1, record("a"));
  gate.set_value();
  while (pool.queued() > 0) std::this_thread::yield();
  pool.Shutdown();
  while (true) {
    std::lock_guard<std::mutex> lock(mu);
    if (order.size() == 12) break;
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(std::vector<std::string>(order.begin() + 6, order.end()), ElementsAre("b", "a", "b", "a", "b", "a"));
}

TEST(FairPoolTest, ShutdownRunsWhatIsQueuedAndLaterClosuresInline) {
  std::atomic<int> ran{0};
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  FairPool pool(2);
  pool.Schedule([open] { open.wait(); });
  for (int i = 0; i < 5; ++i) pool.Schedule("t", "j", 1, [&ran] { ++ran; });
  pool.Shutdown();
  gate.set_value();
  bool inline_run = false;
  pool.Schedule("t", "j", 1, [&inline_run] { inline_run = true; });
  EXPECT_TRUE(inline_run);  // Ran in the caller, after Shutdown.
  while (ran.load() < 5) std::this_thread::yield();
  EXPECT_EQ(pool.queued(), 0u);
}

}  // namespace
}  // namespace orthoserve
