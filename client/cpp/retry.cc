// Implementation of client/cpp/retry.h.
#include "client/cpp/retry.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/types/optional.h"
#include "common/logging.h"
#include "common/retry_after.h"
#include "proto/convert/grpc_status.h"

namespace orthoserve::client {
namespace {

class SystemRetryEnvironment final : public RetryEnvironment {
 public:
  SystemRetryEnvironment() : random_(std::random_device()()) {}

  absl::Time Now() override { return absl::Now(); }
  void Sleep(absl::Duration duration) override { absl::SleepFor(duration); }
  absl::Duration Jitter(absl::Duration bound) override {
    const int64_t limit = absl::ToInt64Nanoseconds(bound);
    if (limit <= 0) return absl::ZeroDuration();
    absl::MutexLock lock(&mu_);
    return absl::Nanoseconds(std::uniform_int_distribution<int64_t>(0, limit)(random_));
  }

 private:
  absl::Mutex mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
};

std::string DurationText(absl::Duration d) { return absl::FormatDuration(d); }

}  // namespace

std::shared_ptr<RetryEnvironment> MakeSystemRetryEnvironment() { return std::make_shared<SystemRetryEnvironment>(); }

absl::Status ValidateRetryOptions(const RetryOptions& o) {
  if (o.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("retry deadline must be positive (or infinite)");
  }
  if (o.initial_backoff < absl::ZeroDuration() || o.max_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("retry backoffs must not be negative");
  }
  if (o.max_backoff < o.initial_backoff) {
    return absl::InvalidArgumentError(absl::StrCat("retry max_backoff (", DurationText(o.max_backoff),
                                                   ") is below initial_backoff (", DurationText(o.initial_backoff),
                                                   "); raise max_backoff"));
  }
  if (!(o.multiplier >= 1) || !std::isfinite(o.multiplier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("retry multiplier must be a finite number >= 1, got ", o.multiplier));
  }
  if (o.max_attempts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("retry max_attempts must be >= 0 (0: bounded by the deadline only), got ", o.max_attempts));
  }
  return absl::OkStatus();
}

namespace {

// The server's retry delay in `trailing` (kRetryAfterKey), when it holds one in range.
std::optional<absl::Duration> TrailingRetryAfter(const std::multimap<grpc::string_ref, grpc::string_ref>& trailing) {
  auto [begin, end] = trailing.equal_range(grpc::string_ref(kRetryAfterKey));
  for (auto it = begin; it != end; ++it) {
    int64_t ms = 0;
    if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) && ms >= 1 &&
        absl::Milliseconds(ms) <= kMaxRetryAfter) {
      return absl::Milliseconds(ms);
    }
  }
  return std::nullopt;
}

}  // namespace

bool IsRetryable(const grpc::Status& status, const std::multimap<grpc::string_ref, grpc::string_ref>& trailing) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) return true;
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) return TrailingRetryAfter(trailing).has_value();
  // The client never cancels a call whose status it reports: CANCELLED came from the server,
  // which gave up on the call (its drain deadline passed, or it shut down as the call arrived).
  if (status.error_code() == grpc::StatusCode::CANCELLED) return true;
  if (status.error_code() != grpc::StatusCode::ABORTED) return false;
  auto [begin, end] = trailing.equal_range(grpc::string_ref(kRetryableKey));
  return std::any_of(begin, end, [](const auto& entry) { return entry.second == grpc::string_ref(kRetryableFleetChange); });
}

bool IsRetryable(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kUnavailable) return true;
  if (status.code() == absl::StatusCode::kResourceExhausted) return RetryAfter(status).has_value();
  if (status.code() != absl::StatusCode::kAborted && status.code() != absl::StatusCode::kCancelled) return false;
  return IsFleetChange(status);
}

absl::Status FromCallStatus(const grpc::Status& status,
                            const std::multimap<grpc::string_ref, grpc::string_ref>& trailing) {
  absl::Status converted = FromGrpcStatus(status);
  if ((status.error_code() == grpc::StatusCode::ABORTED || status.error_code() == grpc::StatusCode::CANCELLED) &&
      IsRetryable(status, trailing)) {
    return MarkFleetChange(std::move(converted));
  }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    if (const std::optional<absl::Duration> delay = TrailingRetryAfter(trailing)) {
      return MarkRetryAfter(std::move(converted), *delay);
    }
  }
  return converted;
}

absl::Status AnnotateKeepingMarks(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { annotated.SetPayload(url, payload); });
  return annotated;
}

RetryLoop::RetryLoop(const RetryOptions& options, RetryEnvironment* environment, absl::Duration per_attempt_timeout,
                     std::string what, std::atomic<int64_t>* retries)
    : options_(options),
      environment_(environment),
      per_attempt_timeout_(per_attempt_timeout),
      what_(std::move(what)),
      retries_(retries),
      deadline_(environment->Now() + options.deadline) {}

absl::Duration RetryLoop::AttemptTimeout() {
  attempt_start_ = environment_->Now();
  cut_ = false;
  attempt_timeout_ = per_attempt_timeout_;
  if (attempt_ == 0 || !options_.enabled) return attempt_timeout_;
  // BackOff only lets a retry start before the deadline; the floor keeps a deadline that passed
  // while this attempt was being prepared from turning into "no deadline".
  const absl::Duration remaining = std::max(deadline_ - attempt_start_, absl::Milliseconds(1));
  if (remaining < per_attempt_timeout_) {
    cut_ = true;
    attempt_timeout_ = remaining;
  }
  return attempt_timeout_;
}

bool RetryLoop::TimedOut(const absl::Status& status) const {
  // gRPC's timer fires at the deadline; the slack absorbs the clocks' granularity.
  return status.code() == absl::StatusCode::kDeadlineExceeded && !cut_ &&
         attempt_timeout_ != absl::InfiniteDuration() &&
         environment_->Now() - attempt_start_ >= attempt_timeout_ * 0.99;
}

bool RetryLoop::BackOff(const absl::Status& status) {
  retryable_ = false;
  if (status.ok()) return false;
  if (status.code() == absl::StatusCode::kDeadlineExceeded && cut_) {
    // A retry ran out of the overall deadline, not of its own timeout: final.
    stop_reason_ = absl::StrCat("retry deadline of ", DurationText(options_.deadline), " reached");
    retryable_ = true;
    return false;
  }
  if (!IsRetryable(status) && !TimedOut(status)) return false;
  retryable_ = true;
  if (!options_.enabled) {
    stop_reason_ = "retries are disabled";
    return false;
  }
  if (options_.max_attempts > 0 && attempt_ + 1 >= options_.max_attempts) {
    stop_reason_ = absl::StrCat("max_attempts ", options_.max_attempts, " reached");
    return false;
  }
  const double growth = std::pow(options_.multiplier, std::min(attempt_, 64));
  const absl::Duration bound = std::min(options_.max_backoff, options_.initial_backoff * growth);
  // A transient refusal waits at least the delay the server asked for.
  const absl::Duration wait = std::max(environment_->Jitter(bound), RetryAfter(status).value_or(absl::ZeroDuration()));
  if (environment_->Now() + wait >= deadline_) {
    stop_reason_ = absl::StrCat("retry deadline of ", DurationText(options_.deadline), " reached");
    return false;
  }
  LOG_WARNING("client") << what_ << ": attempt " << attempt_ << " failed with "
                        << absl::StatusCodeToString(status.code()) << ": " << status.message()
                        << "; retrying as attempt " << attempt_ + 1 << " in " << DurationText(wait);
  if (retries_ != nullptr) retries_->fetch_add(1, std::memory_order_relaxed);
  environment_->Sleep(wait);
  ++attempt_;
  return true;
}

absl::Status RetryLoop::GiveUp(const absl::Status& status) const {
  if (status.ok() || attempt_ == 0) return status;
  const bool stopped_early = retryable_ && !stop_reason_.empty();
  return AnnotateKeepingMarks(status, absl::StrCat("after ", attempt_ + 1, " attempts",
                                                   stopped_early ? absl::StrCat(" (", stop_reason_, ")") : ""));
}

}  // namespace orthoserve::client
