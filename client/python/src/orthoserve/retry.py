"""Retries of the Python client: the policy (RetryPolicy) and the attempts of one call under it (Attempts).

Which failures may be retried is the service's rule (proto/orthoserve/v1/orthogonalizer.proto, above
`service Orthogonalizer`): UNAVAILABLE, ABORTED whose trailing metadata holds `orthoserve-retryable: fleet-change`,
CANCELLED, and RESOURCE_EXHAUSTED whose trailing metadata holds `orthoserve-retry-after-ms` (a transient refusal,
retried after at least that delay); every other code is final (OrthoserveError.retryable). Besides those, the
client retries an attempt that its own per-attempt timeout ended (DEADLINE_EXCEEDED when the attempt's timeout ran
out and was not cut to what remained of the retry deadline): the member it was talking to may have stalled, and the
retry goes elsewhere while the retry deadline allows. Steps are deterministic, so a retry re-sends the whole step,
with StepHeader.attempt one higher.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from typing import Callable, Optional, Protocol

import grpc

from orthoserve import errors

__all__ = ["RetryPolicy", "Attempts", "policy_of"]

# A retry starts only when at least this much of the deadline (seconds; at most a tenth of the deadline) is left
# after its wait: an attempt cut to a millisecond fails with DEADLINE_EXCEEDED before the server can answer.
_MIN_ATTEMPT_SECONDS = 0.05
# A DEADLINE_EXCEEDED counts as the attempt's own timeout running out when at least this fraction of that timeout
# has passed since the attempt began (gRPC's timer fires at the deadline; the slack absorbs clock granularity). An
# earlier DEADLINE_EXCEEDED came from the server (its own wait ran out) and is final like any other code.
_TIMER_FRACTION = 0.99

logger = logging.getLogger("orthoserve")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a client call retries retryable failures.

    The wait before retry k (k = 0 for the first retry) is drawn uniformly from
    [0, min(max_backoff, initial_backoff * multiplier**k)] ("full jitter"). A retry starts only if it can start
    before `deadline` seconds have passed since the call began. Each attempt is still bounded by the call's own
    timeout (a retry's by whatever remains of the deadline, if less). An attempt ended by that per-attempt timeout
    (DEADLINE_EXCEEDED) is retried like a retryable failure; one ended because the deadline ran out is final.

    Attributes:
      enabled: False makes every call a single attempt.
      deadline: seconds for all attempts of one call together; None for no limit.
      initial_backoff: bound of the first wait, seconds.
      max_backoff: largest bound of any wait, seconds.
      multiplier: growth of the bound per retry (>= 1).
      max_attempts: attempts in all, the first included; None for no limit.
    """

    enabled: bool = True
    deadline: Optional[float] = 120.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    max_attempts: Optional[int] = None

    def __post_init__(self) -> None:
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"orthoserve: RetryPolicy.deadline must be > 0 or None, got {self.deadline}")
        if self.initial_backoff < 0:
            raise ValueError(f"orthoserve: RetryPolicy.initial_backoff must be >= 0, got {self.initial_backoff}")
        if self.max_backoff < self.initial_backoff:
            raise ValueError(f"orthoserve: RetryPolicy.max_backoff ({self.max_backoff}) is below initial_backoff "
                             f"({self.initial_backoff})")
        if self.multiplier < 1:
            raise ValueError(f"orthoserve: RetryPolicy.multiplier must be >= 1, got {self.multiplier}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"orthoserve: RetryPolicy.max_attempts must be >= 1 or None, got {self.max_attempts}")

    def backoff_bound(self, retry: int) -> float:
        """The bound of the wait before retry `retry` (0 for the first)."""
        return min(self.max_backoff, self.initial_backoff * self.multiplier ** min(retry, 64))


def policy_of(retry: object) -> RetryPolicy:
    """The policy for Client's `retry` argument: None or True (the defaults), False (disabled) or a RetryPolicy."""
    if retry is None or retry is True:
        return RetryPolicy()
    if retry is False:
        return RetryPolicy(enabled=False)
    if isinstance(retry, RetryPolicy):
        return retry
    raise TypeError(f"orthoserve: retry must be a RetryPolicy, True, False or None, got {type(retry).__name__}")


class GivesUp(Protocol):
    """What Attempts asks of a client's reachability (orthoserve.channels.Reachability)."""

    patience: float

    def gave_up(self, now: float) -> bool:
        ...


class Attempts:
    """The attempts of one call: the timeout of each, the decision to retry, the wait, the log line and the count.

        attempts = Attempts(policy, timeout, "OrthogonalizeStream to host:1", on_retry)
        while True:
            try:
                return attempt(attempts.number, attempts.timeout())
            except errors.OrthoserveError as e:
                if not attempts.back_off(e):
                    raise attempts.give_up(e) from None

    Not thread-safe; one per call. The overall deadline starts at construction.
    """

    def __init__(self, policy: RetryPolicy, timeout: Optional[float], what: str,
                 on_retry: Optional[Callable[[], None]] = None, reachability: Optional["GivesUp"] = None):
        self.policy = policy
        self.what = what
        self._reachability = reachability  # The client's channels' (orthoserve.channels.Reachability), or None.
        self._unreachable = False  # Retrying stopped because no channel of the client has ever connected.
        self.number = 0  # The current attempt: 0 for the first (StepHeader.attempt).
        self._timeout = timeout
        self._on_retry = on_retry
        self._start = time.monotonic()
        self._stop_reason = ""
        self._cut = False  # The current attempt's timeout is what remains of the deadline.
        self._attempt_start = self._start  # When the current attempt's timeout was handed out.
        self._attempt_timeout: Optional[float] = None  # That timeout.
        self._retryable = False  # The last failure given to back_off was one that may be retried.
        self._previous: Optional[errors.OrthoserveError] = None  # The retryable failure before this attempt.
        self._final: Optional[errors.OrthoserveError] = None  # The error give_up reports instead, if any.

    def remaining(self) -> Optional[float]:
        """Seconds left of the overall deadline (None: no deadline)."""
        if self.policy.deadline is None:
            return None
        return self.policy.deadline - (time.monotonic() - self._start)

    def timeout(self) -> Optional[float]:
        """The timeout of the current attempt. The first gets the call's whole timeout (retries never shorten a
        call that would have worked without them); a retry gets it cut to what remains of the deadline. The attempt
        is taken to begin now (see timed_out)."""
        self._cut = False
        self._attempt_start = time.monotonic()
        self._attempt_timeout = self._attempt_timeout_now()
        return self._attempt_timeout

    def _attempt_timeout_now(self) -> Optional[float]:
        if self.number == 0 or not self.policy.enabled:
            return self._timeout
        remaining = self.remaining()
        if remaining is None:
            return self._timeout
        remaining = max(remaining, 0.001)
        self._cut = self._timeout is None or remaining < self._timeout
        return remaining if self._timeout is None else min(self._timeout, remaining)

    def timed_out(self, error: BaseException) -> bool:
        """Whether `error` is the current attempt's own per-attempt timeout running out: a call-level
        DEADLINE_EXCEEDED after (nearly) all of the timeout that timeout() last handed out, when that timeout was the
        call's and not what remained of the retry deadline."""
        return (isinstance(error, errors.OrthoserveError) and error.code == grpc.StatusCode.DEADLINE_EXCEEDED and
                error.matrix is None and not self._cut and self._attempt_timeout is not None and
                time.monotonic() - self._attempt_start >= _TIMER_FRACTION * self._attempt_timeout)

    def back_off(self, error: BaseException) -> bool:
        """After the current attempt failed with `error`: when it is retryable (or the attempt's own timeout ran out:
        timed_out) and the policy allows another attempt that starts before the deadline, logs a warning, counts the
        retry, sleeps the jittered wait, advances `number` and returns True; returns False otherwise."""
        policy = self.policy
        self._retryable = False
        if (isinstance(error, errors.OrthoserveError) and error.code == grpc.StatusCode.DEADLINE_EXCEEDED and
                self._cut and self._previous is not None):
            # A retry ran out of the retry deadline, not of the call's timeout: the call failed because the service
            # stayed unavailable; report that failure.
            self._stop_reason = f"retry deadline of {policy.deadline:g} s reached"
            self._final = self._previous
            self._retryable = True  # The failure reported is the previous, retried one.
            return False
        if not isinstance(error, errors.OrthoserveError) or not (error.retryable or self.timed_out(error)):
            return False
        self._retryable = True
        if (self._reachability is not None and error.code == grpc.StatusCode.UNAVAILABLE and not error.fleet_change
                and self._reachability.gave_up(time.monotonic())):
            self._unreachable = True
            self._stop_reason = (f"no address of this client has ever connected, for {self._reachability.patience:g} s "
                                 "of retries: check the address, that the server is running, and TLS")
            return False
        if not policy.enabled:
            self._stop_reason = "retries are disabled"
            return False
        if policy.max_attempts is not None and self.number + 1 >= policy.max_attempts:
            self._stop_reason = f"max_attempts {policy.max_attempts} reached"
            return False
        wait = random.uniform(0.0, policy.backoff_bound(self.number))
        if error.retry_after is not None:  # A transient refusal: at least the delay the server asked for.
            wait = max(wait, error.retry_after)
        remaining = self.remaining()
        if remaining is not None and remaining - wait < min(_MIN_ATTEMPT_SECONDS, policy.deadline / 10):
            self._stop_reason = f"retry deadline of {policy.deadline:g} s reached"
            return False
        logger.warning("orthoserve: %s failed (attempt %d, %s: %s); retrying in %.3f s", self.what, self.number,
                       error.code.name, error.message, wait)
        if self._on_retry is not None:
            self._on_retry()
        time.sleep(wait)
        self.number += 1
        self._previous = error
        return True

    def give_up(self, error: BaseException) -> BaseException:
        """The exception to raise: `error` itself after a single attempt, else the same error saying how many
        attempts were made (and why retrying stopped, when it stopped on a retryable failure)."""
        if self._final is not None:
            error = self._final
        if self._unreachable and self.number == 0 and isinstance(error, errors.OrthoserveError):
            out = type(error)(error.code, f"{error.message} ({self._stop_reason})", error.matrix,
                              fleet_change=error.fleet_change, retry_after=error.retry_after)
            out.__cause__ = error.__cause__
            return out
        if self.number == 0 or not isinstance(error, errors.OrthoserveError):
            return error
        note = self._stop_reason if self._retryable else ""
        return error.after_attempts(self.number + 1, note)
