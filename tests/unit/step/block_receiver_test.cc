// server/step/block_receiver.h: bytes land in order whatever the chunk boundaries, and the first
// non-finite element is found even when its bytes arrive in two pieces.
#include "server/step/block_receiver.h"

#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace orthoserve {
namespace {

// Feeds `bytes` to a receiver in pieces of `piece` bytes; returns the receiver's buffer.
std::vector<char> Receive(DType dtype, const std::vector<char>& bytes, size_t piece, int64_t* first_bad) {
  std::vector<char> dst(bytes.size());
  BlockReceiver receiver(dtype, dst.data(), static_cast<int64_t>(bytes.size()));
  for (size_t offset = 0; offset < bytes.size(); offset += piece) {
    EXPECT_FALSE(receiver.complete());
    receiver.Append(absl::string_view(bytes.data() + offset, std::min(piece, bytes.size() - offset)));
    EXPECT_EQ(receiver.received(), static_cast<int64_t>(std::min(offset + piece, bytes.size())));
  }
  EXPECT_TRUE(receiver.complete());
  *first_bad = receiver.first_non_finite();
  return dst;
}

std::vector<char> Floats(size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i) * 0.5f - 100.0f;
  std::vector<char> bytes(count * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(BlockReceiverTest, CopiesEveryByteInOrderForAnyPieceSize) {
  const std::vector<char> bytes = Floats(50000);  // 200000 bytes: several internal pieces.
  for (size_t piece : {size_t{1}, size_t{3}, size_t{4096}, size_t{70001}, bytes.size()}) {
    int64_t bad = 0;
    EXPECT_EQ(Receive(DType::kF32, bytes, piece, &bad), bytes) << piece;
    EXPECT_EQ(bad, -1) << piece;
  }
}

TEST(BlockReceiverTest, FindsTheFirstNonFiniteWhereverItsBytesArrive) {
  std::vector<char> bytes = Floats(40000);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 4 * 12345, &inf, 4);
  std::memcpy(bytes.data() + 4 * 30000, &nan, 4);
  // Pieces of 3 bytes split the Inf across two Appends; 8191 and 32768 + 1 straddle the
  // receiver's own scan pieces.
  for (size_t piece : {size_t{3}, size_t{8191}, size_t{32769}, bytes.size()}) {
    int64_t bad = 0;
    Receive(DType::kF32, bytes, piece, &bad);
    EXPECT_EQ(bad, 12345) << piece;
  }
}

TEST(BlockReceiverTest, ScansHalfPrecisionElements) {
  std::vector<uint16_t> values(1000, 0x3c00);  // fp16 1.0 (bf16 1.875).
  values[777] = 0x7c00;                        // fp16 +Inf; bf16 finite.
  std::vector<char> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  int64_t bad = 0;
  Receive(DType::kF16, bytes, 5, &bad);
  EXPECT_EQ(bad, 777);
  Receive(DType::kBF16, bytes, 5, &bad);
  EXPECT_EQ(bad, -1);
}

TEST(BlockReceiverTest, AnEmptyBlockIsCompleteAndFinite) {
  BlockReceiver receiver(DType::kF32, nullptr, 0);
  EXPECT_TRUE(receiver.complete());
  EXPECT_EQ(receiver.first_non_finite(), -1);
}


TEST(BlockReceiverTest, ADigestingReceiverDigestsExactlyTheBytesWhateverTheChunks) {
  const std::vector<char> bytes = Floats(50000);
  StreamDigest whole;
  whole.Update(absl::string_view(bytes.data(), bytes.size()));
  for (size_t piece : {size_t{7}, size_t{32768}, size_t{100001}, bytes.size()}) {
    std::vector<char> dst(bytes.size());
    BlockReceiver receiver(DType::kF32, dst.data(), static_cast<int64_t>(bytes.size()), /*digest=*/true);
    for (size_t offset = 0; offset < bytes.size(); offset += piece) {
      receiver.Append(absl::string_view(bytes.data() + offset, std::min(piece, bytes.size() - offset)));
    }
    EXPECT_EQ(receiver.digest(), whole.Value()) << piece;
  }
  std::vector<char> dst(bytes.size());
  BlockReceiver plain(DType::kF32, dst.data(), static_cast<int64_t>(bytes.size()));
  plain.Append(absl::string_view(bytes.data(), bytes.size()));
  EXPECT_EQ(plain.digest(), 0u);  // A lone step's receiver does not digest.
}

}  // namespace
}  // namespace orthoserve
