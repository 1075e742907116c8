// Implementation of server/shm/mapped_region.h.
#include "server/shm/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/shm/memory_id.h"

namespace orthoserve {
namespace {

// Closes a descriptor on the error paths of Map.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::Map(int fd, int64_t max_bytes) {
  FdCloser closer(fd);
  if (fd < 0) return absl::InvalidArgumentError("no file descriptor was passed");
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::InvalidArgumentError(Errno("fstat of the passed descriptor"));
  if (!S_ISREG(st.st_mode))
    return absl::InvalidArgumentError("the passed descriptor is not a memfd (not a regular file)");
  // Only memfds (and shmem files made sealable) answer F_GET_SEALS; other files fail with EINVAL.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "the passed descriptor is not a sealable memfd (create it with memfd_create(..., MFD_ALLOW_SEALING))");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "the memfd is not sealed against shrinking: add F_SEAL_SHRINK (fcntl F_ADD_SEALS) before passing it");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError("the memfd must be open for reading and writing");
  }
  // Read the size after the seal check: from here on it cannot get smaller.
  if (fstat(fd, &st) != 0) return absl::InvalidArgumentError(Errno("fstat of the passed descriptor"));
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (size <= 0) return absl::OutOfRangeError("the memfd is empty: size it (ftruncate) before passing it");
  if (size > max_bytes) {
    return absl::OutOfRangeError(absl::StrCat("the memfd holds ", size, " bytes; a region may hold at most ", max_bytes,
                                              " (--shm-max-region-bytes)"));
  }
  void* data = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return absl::InternalError(Errno("mmap of the memfd"));
  return std::unique_ptr<MappedRegion>(
      new MappedRegion(closer.Release(), static_cast<char*>(data), size, FileMemoryId(st)));
}

MappedRegion::~MappedRegion() {
  munmap(data_, static_cast<size_t>(size_));
  close(fd_);
}

}  // namespace orthoserve
