// Conversion of Gloo's exceptions into absl::Status at our call sites: Gloo throws, our API
// never does.
#pragma once

#include <exception>
#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace orthoserve::gloo_internal {

// Thrown by our Store adapter back through Gloo's rendezvous code so the Store's own status
// (DEADLINE_EXCEEDED naming the key, UNAVAILABLE) survives the trip.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(absl::Status status) : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Must be called inside a catch block. Maps the exception being handled to a Status whose
// message starts with `context`: a StoreError keeps its status; any Gloo or standard exception
// whose message reports a timeout ("Timed out", "timeout") is DEADLINE_EXCEEDED; every other
// exception (gloo::IoException, gloo::Exception, gloo::EnforceNotMet, std::exception, anything)
// is UNAVAILABLE, with the library's message.
absl::Status StatusFromCurrentException(absl::string_view context);

// Runs `fn` and returns OK, or the status of whatever it threw (see StatusFromCurrentException).
template <typename Fn>
absl::Status CallGloo(absl::string_view context, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (...) {
    return StatusFromCurrentException(context);
  }
}

}  // namespace orthoserve::gloo_internal
