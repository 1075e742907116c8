// Implementation of server/engine/memory.h: HostMemory.
#include "server/engine/memory.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace orthoserve {

absl::StatusOr<MemoryBuffer> HostMemory::Allocate(size_t bytes, bool zero, const char* what) {
  if (bytes == 0) return MemoryBuffer();
  char* data = new (std::nothrow) char[bytes];
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": cannot allocate ", bytes, " bytes of host memory"));
  }
  if (zero) std::memset(data, 0, bytes);
  return MemoryBuffer(data, bytes, [data] { delete[] data; });
}

absl::Status HostMemory::Copy2d(const Copy2dArgs& a) {
  if (a.rows == 0 || a.row_bytes == 0) return absl::OkStatus();
  char* dst = static_cast<char*>(a.dst);
  const char* src = static_cast<const char*>(a.src);
  if (a.rows == 1 || (a.dst_pitch == a.row_bytes && a.src_pitch == a.row_bytes)) {
    std::memcpy(dst, src, a.rows * a.row_bytes);
    return absl::OkStatus();
  }
  for (size_t r = 0; r < a.rows; ++r) std::memcpy(dst + r * a.dst_pitch, src + r * a.src_pitch, a.row_bytes);
  return absl::OkStatus();
}

absl::Status HostMemory::Zero(void* data, size_t bytes) {
  if (bytes > 0) std::memset(data, 0, bytes);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> HostMemory::FindNonFinite(const void* data, DType dtype, int64_t count) {
  if (count <= 0) return -1;
  return orthoserve::FindNonFinite(dtype, data, static_cast<size_t>(count));
}

}  // namespace orthoserve
