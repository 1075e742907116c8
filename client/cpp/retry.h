// Retries of the C++ client: which failures may be retried (the service comment of
// proto/orthoserve/v1/orthogonalizer.proto), the backoff policy (RetryOptions) and the attempts
// of one call under it (RetryLoop), which Client and GroupClient drive.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/fleet_change.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"

namespace orthoserve::client {

// Trailing metadata that makes an ABORTED failure retryable: the step was cut short by a change
// of the fleet's membership.

// The clock, sleep and randomness of the retry loop, so that tests need not sleep for real.
// Implementations must be thread-safe: one is shared by every call of a client.
class RetryEnvironment {
 public:
  virtual ~RetryEnvironment() = default;
  virtual absl::Time Now() = 0;
  virtual void Sleep(absl::Duration duration) = 0;
  // A duration drawn uniformly from [0, bound] (full jitter).
  virtual absl::Duration Jitter(absl::Duration bound) = 0;
};

// absl::Now, absl::SleepFor and a PRNG seeded from std::random_device.
std::shared_ptr<RetryEnvironment> MakeSystemRetryEnvironment();

// How a call retries retryable failures. The wait before retry k (k = 0 for the first retry)
// is drawn uniformly from [0, min(max_backoff, initial_backoff · multiplier^k)].
struct RetryOptions {
  bool enabled = true;                                       // false: every call makes one attempt.
  absl::Duration deadline = absl::Seconds(120);              // All attempts of one call together; Infinite: none.
  absl::Duration initial_backoff = absl::Milliseconds(100);  // Bound of the first wait.
  absl::Duration max_backoff = absl::Seconds(2);             // Largest bound of any wait.
  double multiplier = 2;                                     // Growth of the bound per retry (>= 1).
  int max_attempts = 0;                                      // Attempts in all, the first included; 0: no limit.
  std::shared_ptr<RetryEnvironment> environment;             // Clock, sleep, jitter; null: the system's.
};

// OK, or INVALID_ARGUMENT naming the field to change: a non-positive deadline, a negative
// backoff, max_backoff below initial_backoff, a multiplier below 1, negative max_attempts.
absl::Status ValidateRetryOptions(const RetryOptions& options);

// Whether a failed call may be retried: UNAVAILABLE; ABORTED when `trailing` (the call's
// trailing metadata) holds `orthoserve-retryable: fleet-change`; CANCELLED (the client never
// cancels a call whose status it reports, so the server gave up on it: it was shutting down);
// RESOURCE_EXHAUSTED when `trailing` holds `orthoserve-retry-after-ms` (a transient refusal: a
// fair share or a limit used up for a moment; RetryLoop waits at least that long). Every other
// code is final. (RetryLoop also retries an attempt that its own per-attempt timeout
// ended: RetryLoop::TimedOut.)
bool IsRetryable(const grpc::Status& status, const std::multimap<grpc::string_ref, grpc::string_ref>& trailing);

// The same for a status that left the call: UNAVAILABLE, ABORTED or CANCELLED carrying the mark
// that FromCallStatus (or MarkFleetChange) puts on it, RESOURCE_EXHAUSTED carrying a RetryAfter
// mark (common/retry_after.h).
bool IsRetryable(const absl::Status& status);

// A call's grpc::Status as an absl::Status (same code and message), marked as a fleet change, or
// for RESOURCE_EXHAUSTED with the server's retry delay (MarkRetryAfter), when `trailing` says so,
// so that IsRetryable(absl::Status) still knows after the call. OK stays OK.
absl::Status FromCallStatus(const grpc::Status& status,
                            const std::multimap<grpc::string_ref, grpc::string_ref>& trailing);

// The fleet-change mark itself is MarkFleetChange / IsFleetChange (common/fleet_change.h).
using ::orthoserve::MarkFleetChange;

// `context: message` with the code and the payloads (so the fleet-change mark) of `status`.
absl::Status AnnotateKeepingMarks(const absl::Status& status, absl::string_view context);

// The attempts of one call under a RetryOptions policy: the timeout of each attempt, the decision
// to retry, the wait, the log line and the count. Not thread-safe; one per call.
//
// Besides the retryable codes (IsRetryable), an attempt that ran out of its own per-attempt
// timeout (DEADLINE_EXCEEDED once that timeout has passed: the server, or the connection to it,
// stalled) is retried while the overall deadline allows; the caller sends the retry elsewhere
// when it can. A DEADLINE_EXCEEDED that comes before the attempt's timeout passed (the server's
// own) is final, and so is one of an attempt whose timeout was cut to what remained of the
// overall deadline (GiveUp then says that the retry deadline was reached).
//
//   RetryLoop loop(options.retry, env, options.timeout, "Step to host:1", &retries_);
//   while (true) {
//     absl::Status s = Attempt(loop.attempt(), loop.AttemptTimeout());
//     if (s.ok() || !loop.BackOff(s)) return loop.GiveUp(s);
//   }
class RetryLoop {
 public:
  // `environment` (not null) must outlive the loop. `per_attempt_timeout` is the client's call
  // timeout (InfiniteDuration: none). `what` names the call in log lines. `retries` (may be null)
  // counts each retry. The overall deadline starts now.
  RetryLoop(const RetryOptions& options, RetryEnvironment* environment, absl::Duration per_attempt_timeout,
            std::string what, std::atomic<int64_t>* retries);

  // The current attempt: 0 for the first (StepHeader.attempt).
  int attempt() const { return attempt_; }

  // The timeout to give the current attempt. The first attempt always gets the whole per-attempt
  // timeout (retries never shorten a call that would have worked without them); a retry gets the
  // per-attempt timeout cut to what remains of the overall deadline. The attempt is taken to
  // start now (TimedOut measures from the last call).
  absl::Duration AttemptTimeout();

  // Whether `status` is the current attempt running out of its own per-attempt timeout: a
  // DEADLINE_EXCEEDED when (nearly) all of the timeout AttemptTimeout last gave has passed, and
  // that timeout was the per-attempt one, not what remained of the overall deadline.
  bool TimedOut(const absl::Status& status) const;

  // Call after the current attempt failed with `status`. When it is retryable (IsRetryable, or
  // TimedOut) and the policy allows another attempt that starts before the overall deadline,
  // logs a warning (attempt, code, message, wait), counts the retry, sleeps the jittered backoff,
  // advances attempt() and returns true. Returns false otherwise.
  bool BackOff(const absl::Status& status);

  // Names the call in later log lines (the address of the next attempt, say).
  void set_what(std::string what) { what_ = std::move(what); }

  // The status to return: `status` as it is after a single attempt (or when OK); otherwise its
  // code with "after N attempts[ (why it stopped)]: " in front of its message.
  absl::Status GiveUp(const absl::Status& status) const;

 private:
  const RetryOptions options_;
  RetryEnvironment* const environment_;
  const absl::Duration per_attempt_timeout_;
  std::string what_;
  std::atomic<int64_t>* const retries_;
  const absl::Time deadline_;  // In environment_'s clock.
  int attempt_ = 0;
  std::string stop_reason_;  // Why BackOff declined a retryable failure.
  bool retryable_ = false;   // The last failure BackOff saw was one it may retry (or a cut timeout).
  absl::Time attempt_start_ = absl::InfinitePast();            // When AttemptTimeout was last called.
  absl::Duration attempt_timeout_ = absl::InfiniteDuration();  // What it gave.
  bool cut_ = false;  // That timeout was what remained of the overall deadline.
};

}  // namespace orthoserve::client
