// MemoryPool (server/engine/cuda/memory_pool.cc) on the CPU: linked against a host emulation of
// cudaMalloc / cudaFree / cudaHostAlloc / cudaFreeHost that counts calls and can refuse
// allocations, so the budget, reuse, eviction and out-of-memory paths are checked without a GPU.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/cuda/memory_pool.h"
#include "tests/util/status_matchers.h"

namespace {

// The emulated driver: thread-safe counters and the bytes it has handed out.
std::mutex g_mu;
int g_mallocs = 0;
int g_frees = 0;
size_t g_driver_limit = 0;  // Allocations larger than this fail like a full device (0 = no limit).
std::map<void*, size_t> g_live;
size_t g_live_bytes = 0;
size_t g_peak_bytes = 0;

cudaError_t Allocate(void** p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_driver_limit != 0 && bytes > g_driver_limit) return cudaErrorMemoryAllocation;
  *p = std::malloc(bytes);
  ++g_mallocs;
  g_live[*p] = bytes;
  g_live_bytes += bytes;
  g_peak_bytes = std::max(g_peak_bytes, g_live_bytes);
  return cudaSuccess;
}

}  // namespace

extern "C" {
cudaError_t cudaMalloc(void** p, size_t bytes) { return Allocate(p, bytes); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return Allocate(p, bytes); }
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_live_bytes -= g_live[p];
  g_live.erase(p);
  std::free(p);
  ++g_frees;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" : "cudaErrorEmulated";
}
const char* cudaGetErrorString(cudaError_t) { return "emulated"; }
// cuda_status.cc also refers to these; the pool never calls them.
const char* cublasLtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMULATED"; }
const char* cublasLtGetStatusString(cublasStatus_t) { return "emulated"; }
}

namespace orthoserve::cuda {
namespace {

using ::orthoserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr size_t kMiB = size_t{1} << 20;

class MemoryPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_mallocs = 0;
    g_frees = 0;
    g_driver_limit = 0;
    g_peak_bytes = g_live_bytes;
  }
};

TEST_F(MemoryPoolTest, RoundsUpAndReusesReleasedBlocks) {
  EXPECT_EQ(MemoryPool::RoundUp(1), 512u);
  EXPECT_EQ(MemoryPool::RoundUp(3 * kMiB + 1), 4 * kMiB);
  MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kDevice, 0, 0});
  void* first = nullptr;
  {
    auto block = pool.Acquire(3 * kMiB, "test");
    ASSERT_OK(block);
    first = block->data();
    EXPECT_EQ(block->size(), 4 * kMiB);
    EXPECT_EQ(pool.in_use_bytes(), static_cast<int64_t>(4 * kMiB));
  }
  EXPECT_EQ(pool.in_use_bytes(), 0);
  EXPECT_EQ(pool.held_bytes(), static_cast<int64_t>(4 * kMiB));
  auto again = pool.Acquire(4 * kMiB, "test");
  ASSERT_OK(again);
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(g_mallocs, 1);
}

TEST_F(MemoryPoolTest, OverBudgetIsResourceExhaustedThenFitsAfterRelease) {
  MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kDevice, static_cast<int64_t>(10 * kMiB), 0});
  auto a = pool.Acquire(6 * kMiB, "task 0");
  ASSERT_OK(a);
  EXPECT_THAT(pool.Acquire(6 * kMiB, "task 1"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("task 1: needs 6291456 more bytes")));
  a->Reset();
  auto b = pool.Acquire(6 * kMiB, "task 1");
  ASSERT_OK(b);
  EXPECT_LE(pool.held_bytes(), static_cast<int64_t>(10 * kMiB));
}

TEST_F(MemoryPoolTest, EvictsCachedBlocksToStayUnderBudget) {
  MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kDevice, static_cast<int64_t>(10 * kMiB), 0});
  { ASSERT_OK(pool.Acquire(4 * kMiB, "small")); }  // Cached after release.
  auto big = pool.Acquire(8 * kMiB, "big");
  ASSERT_OK(big);
  EXPECT_EQ(g_frees, 1);  // The cached 4 MiB went back to the driver first.
  EXPECT_EQ(pool.held_bytes(), static_cast<int64_t>(8 * kMiB));
}

TEST_F(MemoryPoolTest, DriverOutOfMemoryIsResourceExhausted) {
  MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kDevice, 0, 0});
  { ASSERT_OK(pool.Acquire(2 * kMiB, "cached")); }
  g_driver_limit = 4 * kMiB;
  EXPECT_THAT(pool.Acquire(16 * kMiB, "task 7"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cudaErrorMemoryAllocation")));
  EXPECT_EQ(pool.held_bytes(), 0);  // The cache was flushed before the retry.
  auto fits = pool.Acquire(2 * kMiB, "task 8");
  EXPECT_OK(fits);
}

TEST_F(MemoryPoolTest, PinnedCacheIsCapped) {
  MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kPinnedHost, 0, static_cast<int64_t>(4 * kMiB)});
  {
    auto a = pool.Acquire(4 * kMiB, "a");
    auto b = pool.Acquire(4 * kMiB, "b");
    ASSERT_OK(a);
    ASSERT_OK(b);
  }
  EXPECT_EQ(g_frees, 1);  // Only one 4 MiB block fits the cache.
  EXPECT_EQ(pool.held_bytes(), static_cast<int64_t>(4 * kMiB));
}

TEST_F(MemoryPoolTest, BlocksMoveWithoutDoubleRelease) {
  MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kDevice, 0, 0});
  auto a = pool.Acquire(kMiB, "a");
  ASSERT_OK(a);
  MemoryPool::Block moved = std::move(*a);
  MemoryPool::Block target;
  target = std::move(moved);
  EXPECT_EQ(pool.in_use_bytes(), static_cast<int64_t>(kMiB));
  target.Reset();
  target.Reset();
  EXPECT_EQ(pool.in_use_bytes(), 0);
  pool.Trim();
  EXPECT_EQ(pool.held_bytes(), 0);
  EXPECT_EQ(g_frees, 1);
}

// Concurrent callers under a budget: the driver never holds more than the budget (allocations
// are reserved under the lock, frees happen outside it), every request either fits or gets
// RESOURCE_EXHAUSTED, and after Trim every allocation has been freed.
TEST_F(MemoryPoolTest, ConcurrentCallersStayWithinTheBudget) {
  static constexpr int64_t kBudget = 16 * kMiB;
  const size_t live_before = g_live_bytes;
  {
    MemoryPool pool(MemoryPool::Options{MemoryPool::Kind::kDevice, kBudget, 0});
    std::vector<std::thread> threads;
    std::atomic<int> granted{0}, refused{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool, &granted, &refused, t] {
        std::mt19937 rng(static_cast<uint32_t>(t));
        std::uniform_int_distribution<size_t> size(1, 6 * kMiB);
        for (int i = 0; i < 300; ++i) {
          auto a = pool.Acquire(size(rng), "concurrent");
          auto b = pool.Acquire(size(rng), "concurrent");
          for (auto* block : {&a, &b}) {
            if (block->ok()) {
              ++granted;
              static_cast<char*>((*block)->data())[0] = 1;  // The memory is usable.
            } else {
              EXPECT_THAT(block->status(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
              ++refused;
            }
          }
          EXPECT_LE(pool.held_bytes(), kBudget);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_GT(granted.load(), 0);
    EXPECT_EQ(pool.in_use_bytes(), 0);
    pool.Trim();
    EXPECT_EQ(pool.held_bytes(), 0);
  }
  EXPECT_LE(g_peak_bytes - live_before, static_cast<size_t>(kBudget));
  EXPECT_EQ(g_live_bytes, live_before);
  EXPECT_EQ(g_mallocs, g_frees);
}

}  // namespace
}  // namespace orthoserve::cuda
