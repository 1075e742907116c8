// NcclCollective on real GPUs: world 1 on one device with host and device buffers (every
// operation, in place, the broken state after a bad call), bootstrap through a Store or without
// one, and — when the machine has two or more GPUs — a world of one rank per GPU in threads,
// checking that sums are rank-ordered and bit-identical on every rank.
#include "server/collective/nccl/nccl_collective.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/in_memory_store.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/util/status_matchers.h"

namespace orthoserve {
namespace {

using gpu_testing::CudaDeviceCount;
using ::orthoserve::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

uint32_t Bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// A device allocation for the test, copied to and from host vectors.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(1, size_) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    // A pageable cudaMemcpy may return before the DMA landed; the collective's own stream does
    // not wait for the default stream, so the buffer must be complete first (its contract).
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~DeviceVector() { cudaFree(data_); }
  T* data() const { return static_cast<T*>(data_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t size_;
};

std::unique_ptr<NcclCollective> WorldOne(Store* store) {
  NcclCollective::Options options;
  options.store = store;
  auto created = NcclCollective::Create(options);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(*created) : nullptr;
}

TEST(NcclNoDeviceTest, CreateFailsCleanlyWithoutDevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_THAT(NcclCollective::Create(NcclCollective::Options{}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CUDA device")));
}

TEST(NcclCollectiveTest, RejectsBadOptions) {
  SKIP_WITHOUT_GPU();
  NcclCollective::Options bad_rank;
  bad_rank.rank = 1;
  EXPECT_THAT(NcclCollective::Create(bad_rank), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  if (std::getenv("NCCL_COMM_ID") == nullptr) {
    NcclCollective::Options no_bootstrap;
    no_bootstrap.world = 2;
    EXPECT_THAT(NcclCollective::Create(no_bootstrap),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NCCL_COMM_ID")));
  }
}

TEST(NcclCollectiveTest, WorldOneHostBuffers) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  auto nccl = WorldOne(&store);
  ASSERT_NE(nccl, nullptr);
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->world(), 1);
  EXPECT_EQ(nccl->name(), "nccl");

  std::vector<char> send(100);
  std::iota(send.begin(), send.end(), 1);
  std::vector<char> recv(100, 0);
  const std::vector<size_t> bytes = {100};
  ASSERT_OK(nccl->AllToAllv(send.data(), bytes, recv.data(), bytes, kTimeout));
  EXPECT_EQ(recv, send);

  std::vector<char> gathered(100, 0);
  ASSERT_OK(nccl->AllGatherv(send.data(), 100, gathered.data(), bytes, kTimeout));
  EXPECT_EQ(gathered, send);
  ASSERT_OK(nccl->AllGatherv(gathered.data(), 100, gathered.data(), bytes, kTimeout));  // In place.
  EXPECT_EQ(gathered, send);

  std::vector<float> f = {1.5f, -2.25f, 3e-8f, 1e30f};
  const std::vector<float> f0 = f;
  ASSERT_OK(nccl->AllReduceSum(absl::MakeSpan(f), kTimeout));
  EXPECT_THAT(f, ElementsAreArray(f0));
  std::vector<double> d = {1e-300, 2.5, -7.0};
  const std::vector<double> d0 = d;
  ASSERT_OK(nccl->AllReduceSum(absl::MakeSpan(d), kTimeout));
  EXPECT_THAT(d, ElementsAreArray(d0));

  std::vector<char> payload = send;
  ASSERT_OK(nccl->Broadcast(payload.data(), payload.size(), 0, kTimeout));
  EXPECT_EQ(payload, send);
  ASSERT_OK(nccl->Barrier(kTimeout));
}

// Operations back to back, each after another's stream polling, then a kernel launch on the same
// thread: no operation may leave an error behind for the next one (a polled cudaErrorNotReady
// used to fail the next launch).
TEST(NcclCollectiveTest, BackToBackOperationsLeaveNoErrorBehind) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  auto nccl = WorldOne(&store);
  ASSERT_NE(nccl, nullptr);
  std::vector<float> big(1 << 22, 0.5f);  // 16 MiB: the first stream poll finds it still busy.
  std::vector<char> bytes(1 << 24, 7), out(1 << 24, 0);
  const std::vector<size_t> sizes = {bytes.size()};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    ASSERT_OK(nccl->AllToAllv(bytes.data(), sizes, out.data(), sizes, kTimeout));
    ASSERT_OK(nccl->AllReduceSum(absl::MakeSpan(big), kTimeout));
    ASSERT_OK(nccl->AllReduceSum(absl::MakeSpan(big), kTimeout));
  }
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(big[12345], 0.5f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(NcclCollectiveTest, WorldOneDeviceBuffers) {
  SKIP_WITHOUT_GPU();
  auto nccl = WorldOne(nullptr);  // World 1 needs no Store and no NCCL_COMM_ID.
  ASSERT_NE(nccl, nullptr);
  std::vector<int32_t> values(1000);
  std::iota(values.begin(), values.end(), -500);
  DeviceVector<int32_t> send(values), recv(std::vector<int32_t>(1000, 0));
  const std::vector<size_t> bytes = {values.size() * sizeof(int32_t)};
  ASSERT_OK(nccl->AllToAllv(send.data(), bytes, recv.data(), bytes, kTimeout));
  EXPECT_EQ(recv.ToHost(), values);

  DeviceVector<int32_t> gathered(std::vector<int32_t>(1000, 0));
  ASSERT_OK(nccl->AllGatherv(send.data(), bytes[0], gathered.data(), bytes, kTimeout));
  EXPECT_EQ(gathered.ToHost(), values);

  // Mixed: device send, host receive.
  std::vector<int32_t> host_recv(1000, 0);
  ASSERT_OK(nccl->AllToAllv(send.data(), bytes, host_recv.data(), bytes, kTimeout));
  EXPECT_EQ(host_recv, values);

  const std::vector<float> f0 = {0.1f, 0.2f, 0.3f};
  DeviceVector<float> f(f0);
  ASSERT_OK(nccl->AllReduceSum(absl::MakeSpan(f.data(), 3), kTimeout));
  EXPECT_THAT(f.ToHost(), ElementsAreArray(f0));
  ASSERT_OK(nccl->Broadcast(send.data(), bytes[0], 0, kTimeout));
  EXPECT_EQ(send.ToHost(), values);
}

TEST(NcclCollectiveTest, BadCallBreaksTheCollective) {
  SKIP_WITHOUT_GPU();
  auto nccl = WorldOne(nullptr);
  ASSERT_NE(nccl, nullptr);
  std::vector<char> data(8);
  EXPECT_THAT(nccl->Broadcast(data.data(), data.size(), 3, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root")));
  EXPECT_THAT(nccl->Barrier(kTimeout), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("broken")));
}

// One rank per GPU, in threads, bootstrapped through one InMemoryStore.
TEST(NcclCollectiveTest, MultiGpuSumsAreRankOrderedAndIdentical) {
  const int world = CudaDeviceCount();
  if (world < 2) GTEST_SKIP() << "needs at least 2 CUDA devices, found " << world;
  InMemoryStore store;
  std::vector<std::vector<float>> results(world);
  std::vector<std::vector<char>> gathered(world);
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      NcclCollective::Options options;
      options.rank = r;
      options.world = world;
      options.device = r;
      options.store = &store;
      options.id_key = "nccl_test/id";
      auto created = NcclCollective::Create(options);
      if (!created.ok()) {
        statuses[r] = created.status();
        return;
      }
      // Values whose float sum depends on the order: 1e8 + 1 + ... .
      std::vector<float> v = {r == 0 ? 1e8f : 1.0f, static_cast<float>(r) * 0.1f};
      statuses[r] = (*created)->AllReduceSum(absl::MakeSpan(v), kTimeout);
      results[r] = v;
      if (!statuses[r].ok()) return;
      std::vector<char> mine(static_cast<size_t>(r + 1), static_cast<char>('a' + r));
      std::vector<size_t> recv_bytes(world);
      for (int p = 0; p < world; ++p) recv_bytes[p] = static_cast<size_t>(p) + 1;
      gathered[r].assign(static_cast<size_t>(world) * static_cast<size_t>(world + 1) / 2, 0);
      statuses[r] = (*created)->AllGatherv(mine.data(), mine.size(), gathered[r].data(), recv_bytes, kTimeout);
    });
  }
  for (auto& t : threads) t.join();
  float expected0 = 0, expected1 = 0;
  for (int r = 0; r < world; ++r) {
    expected0 = expected0 + (r == 0 ? 1e8f : 1.0f);
    expected1 = expected1 + static_cast<float>(r) * 0.1f;
  }
  std::vector<char> expected_gather;
  for (int p = 0; p < world; ++p) expected_gather.insert(expected_gather.end(), p + 1, static_cast<char>('a' + p));
  for (int r = 0; r < world; ++r) {
    ASSERT_OK(statuses[r]);
    // Bit-identical, not merely equal: compare the bit patterns.
    EXPECT_EQ(Bits(results[r][0]), Bits(expected0)) << "rank " << r;
    EXPECT_EQ(Bits(results[r][1]), Bits(expected1)) << "rank " << r;
    EXPECT_EQ(gathered[r], expected_gather) << "rank " << r;
  }
}

}  // namespace
}  // namespace orthoserve
