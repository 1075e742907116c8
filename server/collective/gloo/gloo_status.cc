// Gloo exception -> absl::Status.
#include "server/collective/gloo/gloo_status.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"

namespace orthoserve::gloo_internal {
namespace {

// Gloo reports timeouts as IoException with "Timed out waiting ..." (unbound buffers),
// "Read timeout", "Write timeout", "Connect timeout" (pairs), "Wait timeout for key(s)" (its
// stores) or "Application timeout caused pair closure" (a pair closed because another
// operation of the same context timed out).
bool IsTimeoutMessage(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout");
}

absl::Status FromMessage(absl::string_view context, absl::string_view kind, absl::string_view message) {
  const std::string text = absl::StrCat(context, ": ", kind, ": ", message);
  if (IsTimeoutMessage(message)) return absl::DeadlineExceededError(text);
  return absl::UnavailableError(text);
}

}  // namespace

absl::Status StatusFromCurrentException(absl::string_view context) {
  try {
    throw;
  } catch (const StoreError& e) {
    return absl::Status(e.status().code(), absl::StrCat(context, ": store: ", e.status().message()));
  } catch (const ::gloo::IoException& e) {
    return FromMessage(context, "gloo I/O error", e.what());
  } catch (const ::gloo::Exception& e) {
    return FromMessage(context, "gloo error", e.what());
  } catch (const ::gloo::EnforceNotMet& e) {
    return FromMessage(context, "gloo assertion failed", e.what());
  } catch (const std::exception& e) {
    return FromMessage(context, "exception", e.what());
  } catch (...) {
    return absl::UnavailableError(absl::StrCat(context, ": unknown exception"));
  }
}

}  // namespace orthoserve::gloo_internal
