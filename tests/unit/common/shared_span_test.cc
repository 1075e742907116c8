// common/shared_span.h: SharedSpan::Overlaps at its edges, and FirstWriteOverlap against a
// brute-force reference (every pair) on random spans.
#include "common/shared_span.h"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace orthoserve {
namespace {

constexpr MemoryId kA{1, 2, 3};
constexpr MemoryId kB{1, 2, 4};

TEST(SharedSpanTest, OverlapsOnlyWhenSharingAByteOfTheSameKnownMemory) {
  EXPECT_TRUE((SharedSpan{kA, 0, 10}.Overlaps(SharedSpan{kA, 9, 1})));
  EXPECT_FALSE((SharedSpan{kA, 0, 10}.Overlaps(SharedSpan{kA, 10, 1})));   // Adjacent.
  EXPECT_FALSE((SharedSpan{kA, 10, 5}.Overlaps(SharedSpan{kA, 0, 10})));
  EXPECT_TRUE((SharedSpan{kA, 3, 1}.Overlaps(SharedSpan{kA, 0, 10})));     // Inside.
  EXPECT_FALSE((SharedSpan{kA, 0, 10}.Overlaps(SharedSpan{kB, 0, 10})));   // Another memory.
  EXPECT_FALSE((SharedSpan{kA, 0, 0}.Overlaps(SharedSpan{kA, 0, 10})));    // Empty.
  EXPECT_FALSE((SharedSpan{MemoryId{}, 0, 10}.Overlaps(SharedSpan{MemoryId{}, 0, 10})));  // Unknown.
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE((SharedSpan{kA, big - 1, 1}.Overlaps(SharedSpan{kA, 0, big})));  // No overflow.
  EXPECT_FALSE((SharedSpan{kA, big - 1, 1}.Overlaps(SharedSpan{kA, 0, big - 1})));
}

TEST(FirstWriteOverlapTest, InputsMayOverlapInputsButNothingMayOverlapAResult) {
  std::vector<SpanUse> uses = {
      {SharedSpan{kA, 0, 100}, false, 0, 0},
      {SharedSpan{kA, 50, 100}, false, 1, 0},  // Input on input: fine.
      {SharedSpan{kA, 200, 10}, true, 0, 1},
  };
  EXPECT_FALSE(FirstWriteOverlap(uses).has_value());
  uses.push_back({SharedSpan{kA, 140, 61}, true, 1, 1});  // Overlaps rank 1's input and rank 0's result.
  const auto overlap = FirstWriteOverlap(uses);
  ASSERT_TRUE(overlap.has_value());
  EXPECT_TRUE(uses[overlap->first].span.Overlaps(uses[overlap->second].span));
  EXPECT_TRUE(uses[overlap->first].writes || uses[overlap->second].writes);
  EXPECT_EQ(overlap->second, 3u);
}

TEST(FirstWriteOverlapTest, TwoRanksNamingOneResultSlice) {
  const std::vector<SpanUse> uses = {{SharedSpan{kA, 4096, 64}, true, 0, 0}, {SharedSpan{kA, 4096, 64}, true, 1, 0}};
  const auto overlap = FirstWriteOverlap(uses);
  ASSERT_TRUE(overlap.has_value());
  EXPECT_EQ(overlap->first, 0u);
  EXPECT_EQ(overlap->second, 1u);
  EXPECT_EQ(SpanUseText(uses[1]), "trainer rank 1's result slice of matrix 0 (bytes 4096..4160 of its memory)");
}

// Whether any pair overlaps with a writer, by comparing every pair.
bool AnyWriteOverlap(const std::vector<SpanUse>& uses) {
  for (size_t i = 0; i < uses.size(); ++i) {
    for (size_t j = i + 1; j < uses.size(); ++j) {
      if ((uses[i].writes || uses[j].writes) && uses[i].span.Overlaps(uses[j].span)) return true;
    }
  }
  return false;
}

TEST(FirstWriteOverlapTest, AgreesWithEveryPairOnRandomSpans) {
  std::mt19937_64 rng(7);
  int found = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<SpanUse> uses(1 + rng() % 12);
    for (SpanUse& u : uses) {
      u.span = SharedSpan{(rng() % 3 == 0) ? kB : kA, static_cast<int64_t>(rng() % 200),
                          static_cast<int64_t>(rng() % 30)};
      u.writes = rng() % 3 == 0;
      if (rng() % 10 == 0) u.span.memory = MemoryId{};
    }
    const auto overlap = FirstWriteOverlap(uses);
    ASSERT_EQ(overlap.has_value(), AnyWriteOverlap(uses)) << "trial " << trial;
    if (overlap.has_value()) {
      ++found;
      const SpanUse& a = uses[overlap->first];
      const SpanUse& b = uses[overlap->second];
      EXPECT_LT(overlap->first, overlap->second);
      EXPECT_TRUE(a.span.Overlaps(b.span));
      EXPECT_TRUE(a.writes || b.writes);
    }
  }
  EXPECT_GT(found, 100);  // The trials exercise both answers.
  EXPECT_LT(found, 3900);
}

}  // namespace
}  // namespace orthoserve
