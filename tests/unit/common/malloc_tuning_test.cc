// KeepFreedMemory (common/malloc_tuning.h): an operator's glibc.malloc tunables win, and
// once applied a freed multi-MiB block stays in the process instead of going back to the kernel.
#include "common/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoserve {
namespace {

using ::testing::HasSubstr;

TEST(MallocTuningTest, AnOperatorsMallocTunablesWin) {
  const MallocTuning tuning = KeepFreedMemory("glibc.pthread.rseq=0:glibc.malloc.trim_threshold=131072");
  EXPECT_FALSE(tuning.applied);
  EXPECT_THAT(tuning.description, HasSubstr("GLIBC_TUNABLES"));
}

TEST(MallocTuningTest, WithoutAnArgumentItReadsThisProcesssGlibcTunables) {
  const char* saved = std::getenv("GLIBC_TUNABLES");
  const std::string restore = saved == nullptr ? "" : saved;
  ASSERT_EQ(setenv("GLIBC_TUNABLES", "glibc.malloc.perturb=0", 1), 0);
  const MallocTuning tuning = KeepFreedMemory();
  if (saved == nullptr) {
    unsetenv("GLIBC_TUNABLES");
  } else {
    setenv("GLIBC_TUNABLES", restore.c_str(), 1);
  }
  EXPECT_FALSE(tuning.applied);
  EXPECT_THAT(tuning.description, HasSubstr("GLIBC_TUNABLES"));
}

TEST(MallocTuningTest, AFreedBlockOfSomeMiBIsKeptForReuse) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc's: mallopt has nothing to tune";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc's: mallopt has nothing to tune";
#endif
#endif
  // Other tunables (none of glibc.malloc) do not stop it.
  const MallocTuning tuning = KeepFreedMemory("glibc.pthread.rseq=0");
  ASSERT_TRUE(tuning.applied) << tuning.description;
  EXPECT_THAT(tuning.description, HasSubstr("32 MiB"));

  // 24 MiB: above glibc's default mmap threshold (128 KiB, and at most 32 MiB when it adapts),
  // so by default it would be a fresh mapping, unmapped again on free.
  constexpr size_t kBytes = size_t{24} << 20;
  const struct mallinfo2 before = mallinfo2();
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the block was mapped on its own, not taken from the heap";
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_GE(after.fordblks, before.fordblks + kBytes) << "the freed block went back to the kernel";
  EXPECT_GE(after.arena, before.arena + kBytes);
}

}  // namespace
}  // namespace orthoserve
