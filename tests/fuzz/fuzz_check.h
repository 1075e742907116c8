// Checks for the fuzz targets (tests/fuzz): a failed FUZZ_CHECK prints what it checked and
// aborts, which libFuzzer (scripts/fuzz.sh) and the corpus replay under CTest both count as a
// finding. No gRPC, no protobuf.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve::fuzz {

// Collects the message of a failed check and aborts when destroyed (at the end of the statement).
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": FUZZ_CHECK failed: " << condition << ": ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::abort();
  }
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Turns `CheckFailure(...) << ...` into a void expression (`&` binds more loosely than `<<`), so
// that FUZZ_CHECK is one expression and safe inside an unbraced `if`.
struct Voidify {
  void operator&(const CheckFailure&) const {}
};

// Status messages travel in gRPC's trailing metadata (common/message_text.h): whatever a peer
// sent, a message this large is a bug (every echo of outside text is bounded far below it).
inline constexpr size_t kMaxStatusMessageBytes = 4096;

}  // namespace orthoserve::fuzz

// FUZZ_CHECK(condition) << "context": a finding unless `condition` holds.
#define FUZZ_CHECK(condition)                  \
  (condition) ? static_cast<void>(0)           \
              : ::orthoserve::fuzz::Voidify() & \
                    ::orthoserve::fuzz::CheckFailure(__FILE__, __LINE__, #condition)

// A finding unless `status` is OK or has one of the codes listed, with a bounded message.
#define FUZZ_CHECK_ERROR(status, ...)                                                                          \
  do {                                                                                                         \
    const ::absl::Status& fuzz_status_ = (status);                                                             \
    if (!fuzz_status_.ok()) {                                                                                  \
      bool fuzz_known_ = false;                                                                                \
      for (::absl::StatusCode fuzz_code_ : {__VA_ARGS__}) fuzz_known_ = fuzz_known_ || fuzz_status_.code() == fuzz_code_; \
      FUZZ_CHECK(fuzz_known_) << "unexpected code: " << fuzz_status_;                                          \
      FUZZ_CHECK(fuzz_status_.message().size() <= ::orthoserve::fuzz::kMaxStatusMessageBytes)                  \
          << "a message of " << fuzz_status_.message().size() << " bytes: " << fuzz_status_.message().substr(0, 300); \
    }                                                                                                          \
  } while (false)
