// Implementation of server/shm/random_id.h.
#include "server/shm/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace orthoserve {

absl::StatusOr<std::string> RandomId128() {
  uint8_t bits[16];
  size_t got = 0;
  // getrandom of at most 256 bytes from the urandom pool returns them whole once the pool is
  // initialized; EINTR can only come before any byte was read. Bounded: a few tries.
  for (int attempt = 0; attempt < 8 && got < sizeof(bits); ++attempt) {
    const ssize_t n = getrandom(bits + got, sizeof(bits) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
  }
  if (got < sizeof(bits)) return absl::InternalError("getrandom gave too few bytes");
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bits), sizeof(bits)));
}

}  // namespace orthoserve
