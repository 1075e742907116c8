// One memfd handed over by a client, checked and mapped into the server: the memory a registered
// region's slices point into. No gRPC; see docs/shared_memory.md for why these checks.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "server/shm/region_memory.h"

namespace orthoserve {

class MappedRegion final : public RegionMemory {
 public:
  // Takes ownership of `fd` (closed on every path, error or not). The file must be a memfd
  // sealed with F_SEAL_SHRINK (so that nobody can truncate it under a step: SIGBUS), of 1 to
  // `max_bytes` bytes; it is mapped shared, read and write, at the size it has now (growing it
  // later is harmless: the server never looks past this size). Errors: INVALID_ARGUMENT for a
  // descriptor that is not a sealed memfd or not read-write, OUT_OF_RANGE for an empty or too
  // large one, INTERNAL if the mapping fails.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> Map(int fd, int64_t max_bytes);

  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  // Unmaps the memory and closes the descriptor: only once nothing uses the memory (the registry's
  // leases make sure of it).
  ~MappedRegion() override;

  char* data() const override { return data_; }
  int64_t size() const override { return size_; }
  // The memfd's device and inode on this host's boot: the same in every process that maps it.
  MemoryId memory_id() const override { return id_; }

 private:
  MappedRegion(int fd, char* data, int64_t size, MemoryId id) : fd_(fd), data_(data), size_(size), id_(id) {}

  const int fd_;
  char* const data_;
  const int64_t size_;
  const MemoryId id_;
};

}  // namespace orthoserve
