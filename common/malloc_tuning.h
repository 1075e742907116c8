// How a process's malloc treats memory it frees: for the server, and for trainers that stream
// large steps through the C++ client.
//
// Both ends of a stream move matrices of many MiB. gRPC reads each message into buffers of up to
// a few MiB and frees them once the message is parsed, and a client returns each result in a new
// vector (MatrixOutput::data) that the trainer frees after the step. glibc's default gives such
// memory back to the kernel on free (madvise in a thread's arena, trimming the main heap, munmap
// of large blocks), and the next use faults fresh, zeroed pages in again. On the loopback
// transport benchmark that churn was a quarter of the server's CPU (bench/results/service.md).
// KeepFreedMemory tells glibc to keep freed memory for reuse instead. The price is that the
// process's resident memory stays near its high-water mark.
//
// The server calls it at start-up (server/main.cc; --max-inflight-bytes bounds its high-water
// mark). The client library never changes its host process's malloc on its own: a trainer opts
// in by calling KeepFreedMemory() early in main (docs/operations.md).
#pragma once

#include <cstdlib>
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

// The same, with this process's GLIBC_TUNABLES.
inline MallocTuning KeepFreedMemory() { return KeepFreedMemory(std::getenv("GLIBC_TUNABLES")); }

}  // namespace orthoserve
