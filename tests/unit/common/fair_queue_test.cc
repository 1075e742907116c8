// common/fair_queue.h's PushFront: the rest of a popped item keeps its place at the head of its
// job (ahead of the job's later items) while other jobs and tenants still take their turns by
// their tags.
#include "common/fair_queue.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoserve {
namespace {

using ::testing::ElementsAre;

TEST(FairQueueTest, TheRestOfAPoppedItemGoesAheadOfItsJobButNotAheadOfOthers) {
  FairQueue<std::string> q;
  q.Push("a", "job", 1, "a1 part 1");
  q.Push("a", "job", 1, "a2");
  q.Push("b", "job", 1, "b1");
  std::vector<std::string> order;
  order.push_back(q.Pop());
  ASSERT_EQ(order.back(), "a1 part 1");
  // Its rest is queued again ahead of a2 (the job's order stands), charged like any next item:
  // b1, which waited, goes first.
  q.PushFront("a", "job", 1, "a1 part 2");
  while (!q.empty()) order.push_back(q.Pop());
  EXPECT_THAT(order, ElementsAre("a1 part 1", "b1", "a1 part 2", "a2"));
}

TEST(FairQueueTest, PushFrontOnAnEmptyJobIsAPush) {
  FairQueue<std::string> q;
  q.Push("a", "x", 1, "x1");
  q.PushFront("a", "y", 1, "y1");
  q.Push("a", "y", 1, "y2");
  std::vector<std::string> order;
  while (!q.empty()) order.push_back(q.Pop());
  EXPECT_THAT(order, ElementsAre("x1", "y1", "y2"));
}

}  // namespace
}  // namespace orthoserve
