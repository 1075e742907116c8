// Implementation of client/cpp/run_id.h.
#include "client/cpp/run_id.h"

#include <cstdint>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"

namespace orthoserve::client {
namespace {

std::string Random128Hex() {
  std::random_device device;
  const uint64_t high = (static_cast<uint64_t>(device()) << 32) ^ device();
  const uint64_t low = (static_cast<uint64_t>(device()) << 32) ^ device();
  return absl::StrCat(absl::Hex(high, absl::kZeroPad16), absl::Hex(low, absl::kZeroPad16));
}

std::string FromEnvironmentOrRandom() {
  for (const char* variable : {"ORTHOSERVE_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0') return value;
  }
  return absl::StrCat("cpp-", Random128Hex());
}

}  // namespace

const std::string& DefaultRunId() {
  static const std::string* const run_id = new std::string(FromEnvironmentOrRandom());
  return *run_id;
}

std::string NewCallId() { return Random128Hex(); }

}  // namespace orthoserve::client
