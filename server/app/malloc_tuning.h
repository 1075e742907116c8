// How the server process's malloc treats memory it frees.
//
// A rank streams matrices of many MiB. gRPC reads each message into buffers of up to a few MiB
// and frees them once the message is parsed; glibc's default gives such memory back to the
// kernel on free (madvise in a thread's arena, trimming the main heap, munmap of large blocks),
// and the next read faults fresh, zeroed pages in again. On the loopback transport benchmark
// that churn was a quarter of the server's CPU (bench/results/service.md). The server therefore
// tells glibc, once at start-up, to keep freed memory for reuse. The price is that the
// process's resident memory stays near its high-water mark, which --max-inflight-bytes bounds.
#pragma once

#include <string>

namespace orthoserve {

// The settings KeepFreedMemory applies: blocks up to kMallocMmapThreshold come from malloc's
// heaps (not a fresh mapping each), and a heap's free top is returned to the kernel only above
// kMallocTrimThreshold (a thread arena's heap, at most 64 MiB, never).
inline constexpr size_t kMallocMmapThreshold = size_t{32} << 20;
inline constexpr size_t kMallocTrimThreshold = size_t{1} << 30;

struct MallocTuning {
  bool applied = false;     // Whether this call changed malloc's settings.
  std::string description;  // One line for the start-up log: what was set, or why not.
};

// Applies the settings above with mallopt, unless `glibc_tunables` (the GLIBC_TUNABLES
// environment variable's value; null when unset) sets any glibc.malloc tunable: an operator's
// own malloc settings win. Call once, early in main. Process-wide; not thread-safe against
// concurrent calls to itself.
MallocTuning KeepFreedMemory(const char* glibc_tunables);

}  // namespace orthoserve
