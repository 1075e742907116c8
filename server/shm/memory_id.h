// The MemoryId (common/shared_span.h) of a region's memory: a memfd's is the same in every
// process on this host (its boot, device and inode); memory only this process can name (CUDA IPC
// mappings) gets an id of this process alone.
#pragma once

#include <sys/stat.h>

#include "common/shared_span.h"

namespace orthoserve {

// The host's boot: the first 64 bits of /proc/sys/kernel/random/boot_id (a random UUID drawn at
// every boot), or a non-zero hash of the hostname where that file cannot be read.
uint64_t HostBootId();

// The id of a file's memory, from its fstat.
MemoryId FileMemoryId(const struct stat& st);

// An id for memory at `base` that only this process names.
MemoryId ProcessMemoryId(const void* base);

}  // namespace orthoserve
