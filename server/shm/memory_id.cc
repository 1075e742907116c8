// Implementation of server/shm/memory_id.h.
#include "server/shm/memory_id.h"

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "server/shm/region_memory.h"

namespace orthoserve {

uint64_t HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string text;
  uint64_t id = 0;
  if (in && std::getline(in, text)) {
    const std::string hex = absl::StrReplaceAll(text, {{"-", ""}});
    if (hex.size() >= 16 && absl::SimpleHexAtoi(hex.substr(0, 16), &id) && id != 0) return id;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  id = std::hash<std::string>()(host);
  return id != 0 ? id : 1;
}

MemoryId FileMemoryId(const struct stat& st) {
  return MemoryId{HostBootId(), static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

MemoryId ProcessMemoryId(const void* base) {
  // No file has st_dev ~0: the device marks an id of this process, which holds the pid.
  return MemoryId{HostBootId() ^ (static_cast<uint64_t>(getpid()) << 1), ~uint64_t{0},
                  static_cast<uint64_t>(reinterpret_cast<uintptr_t>(base))};
}

MemoryId RegionMemory::memory_id() const { return ProcessMemoryId(data()); }

}  // namespace orthoserve
