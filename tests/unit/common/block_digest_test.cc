// Block digests: independent of how the bytes were cut, and sensitive to any byte, to where a
// block lies and to its dtype.
#include "common/block_digest.h"

#include <string>

#include "gtest/gtest.h"

namespace orthoserve {
namespace {

uint64_t Whole(const std::string& bytes) {
  StreamDigest d;
  d.Update(bytes);
  return d.Value();
}

TEST(BlockDigestTest, TheSameBytesCutDifferentlyGiveTheSameDigest) {
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  StreamDigest pieces;
  for (size_t offset = 0; offset < bytes.size(); offset += 333) pieces.Update(absl::string_view(bytes).substr(offset, 333));
  EXPECT_EQ(pieces.Value(), Whole(bytes));
  std::string changed = bytes;
  changed[54321] ^= 1;
  EXPECT_NE(Whole(changed), Whole(bytes));
  EXPECT_NE(Whole(bytes.substr(1)), Whole(bytes));
}

TEST(BlockDigestTest, AStepsDigestCoversEveryBlocksPlaceDtypeAndBytesInOrder) {
  const DigestedBlock a{Block{0, 0, 4, 8}, DType::kF32, Whole("a")};
  const DigestedBlock b{Block{4, 0, 4, 8}, DType::kF32, Whole("b")};
  const uint64_t ab = StepDigest({a, b});
  EXPECT_EQ(StepDigest({a, b}), ab);
  EXPECT_NE(StepDigest({b, a}), ab);
  EXPECT_NE(StepDigest({a}), ab);
  DigestedBlock moved = b;
  moved.block.row_offset = 5;
  EXPECT_NE(StepDigest({a, moved}), ab);
  DigestedBlock bf16 = b;
  bf16.dtype = DType::kBF16;
  EXPECT_NE(StepDigest({a, bf16}), ab);
  DigestedBlock other = b;
  other.bytes = Whole("c");
  EXPECT_NE(StepDigest({a, other}), ab);
}

}  // namespace
}  // namespace orthoserve
