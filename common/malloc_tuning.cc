// Implementation of common/malloc_tuning.h.
#include "common/malloc_tuning.h"

#include <malloc.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace orthoserve {

MallocTuning KeepFreedMemory(const char* glibc_tunables) {
  MallocTuning tuning;
  if (glibc_tunables != nullptr && absl::StrContains(glibc_tunables, "glibc.malloc.")) {
    tuning.description = "malloc: GLIBC_TUNABLES sets glibc.malloc tunables; leaving malloc's settings to them";
    return tuning;
  }
  // The trim threshold first: setting either one turns off glibc's dynamic adjustment of both.
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThreshold)) != 1 ||
      mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThreshold)) != 1) {
    tuning.description = "malloc: mallopt refused the thresholds; freed memory goes back to the kernel as usual";
    return tuning;
  }
  tuning.applied = true;
  tuning.description = absl::StrCat("malloc: keeping freed memory for reuse (blocks up to ", kMallocMmapThreshold >> 20,
                                    " MiB from the heap, trim above ", kMallocTrimThreshold >> 20,
                                    " MiB); set GLIBC_TUNABLES=glibc.malloc.* to override");
  return tuning;
}

}  // namespace orthoserve
