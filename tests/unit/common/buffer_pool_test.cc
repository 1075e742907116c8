// common/buffer_pool.h: reuse of released buffers by size, the idle cap, and buffers that
// outlive their pool's last outside reference.
#include "common/buffer_pool.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using ::orthoserve::testing::StatusIs;

std::shared_ptr<PooledBuffer> Get(BufferPool& pool, size_t size) {
  absl::StatusOr<std::shared_ptr<PooledBuffer>> buffer = pool.Get(size);
  EXPECT_OK(buffer.status());
  return buffer.ok() ? *buffer : nullptr;
}

TEST(BufferPoolTest, ReleasedBuffersAreReusedForTheSameSize) {
  auto pool = BufferPool::Create(BufferPool::Options{});
  auto first = Get(*pool, 1000);
  ASSERT_EQ(first->size(), 1000u);
  std::memset(first->data(), 7, first->size());
  const char* memory = first->data();
  first.reset();
  EXPECT_EQ(pool->idle_bytes(), 1000);
  auto again = Get(*pool, 1000);
  EXPECT_EQ(again->data(), memory);
  EXPECT_EQ(pool->idle_bytes(), 0);
}

TEST(BufferPoolTest, ReuseAllowsAnEighthOfSlackAndPicksTheSmallestFit) {
  auto pool = BufferPool::Create(BufferPool::Options{});
  auto big = Get(*pool, 1200);
  auto fit = Get(*pool, 1100);
  const char* big_memory = big->data();
  const char* fit_memory = fit->data();
  big.reset();
  fit.reset();
  EXPECT_EQ(pool->idle_bytes(), 2300);
  // 1000 + 1000/8 = 1125: the 1100-byte buffer fits, the 1200-byte one does not.
  auto a = Get(*pool, 1000);
  EXPECT_EQ(a->data(), fit_memory);
  EXPECT_EQ(a->size(), 1000u);
  auto b = Get(*pool, 1000);
  EXPECT_NE(b->data(), big_memory);
  EXPECT_EQ(pool->idle_bytes(), 1200);
  // A larger request takes the 1200-byte buffer.
  auto c = Get(*pool, 1100);
  EXPECT_EQ(c->data(), big_memory);
}

TEST(BufferPoolTest, KeepsAtMostMaxIdleBytes) {
  auto pool = BufferPool::Create(BufferPool::Options{2500});
  auto a = Get(*pool, 1000), b = Get(*pool, 1000), c = Get(*pool, 1000);
  a.reset();
  b.reset();
  c.reset();  // Over the cap: freed.
  EXPECT_EQ(pool->idle_bytes(), 2000);
  auto big = Get(*pool, 4000);
  big.reset();  // Larger than the cap.
  EXPECT_EQ(pool->idle_bytes(), 2000);
}

TEST(BufferPoolTest, BuffersKeepThePoolAlive) {
  auto pool = BufferPool::Create(BufferPool::Options{});
  auto buffer = Get(*pool, 64);
  std::weak_ptr<BufferPool> weak = pool;
  pool.reset();
  EXPECT_FALSE(weak.expired());
  std::memset(buffer->data(), 1, buffer->size());
  buffer.reset();  // Returns its memory to the pool, which then goes.
  EXPECT_TRUE(weak.expired());
}

TEST(BufferPoolTest, ImpossibleSizesAreResourceExhausted) {
  auto pool = BufferPool::Create(BufferPool::Options{});
  EXPECT_THAT(pool->Get(size_t{1} << 62).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("matrix buffer")));
}

}  // namespace
}  // namespace orthoserve
