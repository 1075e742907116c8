// Chunk splitting and chunk-size selection of client/cpp/chunking.h.
#include "client/cpp/chunking.h"

#include <numeric>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoserve::client {
namespace {

std::string Bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 31 + 7);
  return s;
}

TEST(SplitChunks, FullChunksThenAShorterLastOne) {
  const std::string data = Bytes(10);
  auto chunks = SplitChunks(data.data(), data.size(), 4);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].size(), 4u);
  EXPECT_EQ(chunks[1].size(), 4u);
  EXPECT_EQ(chunks[2].size(), 2u);
  EXPECT_EQ(std::string(chunks[0]) + std::string(chunks[1]) + std::string(chunks[2]), data);
  EXPECT_EQ(chunks[0].data(), data.data());  // Views alias the input.
}

TEST(SplitChunks, ExactMultipleHasNoEmptyTail) {
  const std::string data = Bytes(12);
  auto chunks = SplitChunks(data.data(), data.size(), 4);
  ASSERT_EQ(chunks.size(), 3u);
  for (auto c : chunks) EXPECT_EQ(c.size(), 4u);
}

TEST(SplitChunks, SmallerThanOneChunkAndEmpty) {
  const std::string data = Bytes(3);
  auto one = SplitChunks(data.data(), data.size(), 4096);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(std::string(one[0]), data);
  EXPECT_TRUE(SplitChunks(nullptr, 0, 4).empty());  // An empty block sends no chunks.
}

TEST(SplitChunks, ReassemblesForManySizes) {
  const std::string data = Bytes(1000);
  for (size_t chunk : {1u, 7u, 64u, 999u, 1000u, 1001u}) {
    std::string joined;
    size_t count = 0;
    for (auto c : SplitChunks(data.data(), data.size(), chunk)) {
      EXPECT_LE(c.size(), chunk);
      EXPECT_GT(c.size(), 0u);
      joined += std::string(c);
      ++count;
    }
    EXPECT_EQ(joined, data) << chunk;
    EXPECT_EQ(count, (data.size() + chunk - 1) / chunk) << chunk;
  }
}

TEST(EffectiveChunkBytes, DefaultsAndClampsToTheServer) {
  v1::Limits none;
  EXPECT_EQ(EffectiveChunkBytes(0, none), kDefaultChunkBytes);
  EXPECT_EQ(EffectiveChunkBytes(1000, none), 1000u);
  v1::Limits limits;
  limits.set_chunk_bytes(1 << 20);
  EXPECT_EQ(EffectiveChunkBytes(0, limits), size_t{1} << 20);
  EXPECT_EQ(EffectiveChunkBytes(4096, limits), 4096u);  // A smaller request stays.
  limits.set_max_message_bytes(100000);
  EXPECT_EQ(EffectiveChunkBytes(0, limits), 100000 - kChunkFramingBytes);
  limits.set_max_message_bytes(10);
  EXPECT_EQ(EffectiveChunkBytes(0, limits), 1u);
}

}  // namespace
}  // namespace orthoserve::client
