"""A stream call never outlives its deadline by more than a margin (OverdueGuard).

gRPC enforces a call's deadline itself: the deadline's event ends the call, and the thread reading its responses
gets DEADLINE_EXCEEDED. Reading a stream's responses waits for such events with no timeout of its own, though, so a
call whose events stop arriving (seen once in CI: a stream to a server stopped in the same process, read for over
200 s past its 90 s deadline) would block its reader for ever. The guard cancels such a call OVERDUE_MARGIN after its
deadline: gRPC then ends the operations its reader waits for (as it would at the deadline), and the client reports
DEADLINE_EXCEEDED (retried like the attempt's own timeout, at another member when there is one). A gRPC whose
completion thread itself no longer runs would not end them; nothing in the client can.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import grpc

from orthoserve import errors

__all__ = ["OVERDUE_MARGIN", "OverdueGuard"]

# Seconds past a call's deadline after which the guard cancels it (gRPC's own deadline normally ends it first).
OVERDUE_MARGIN = 5.0


class OverdueGuard:
    """Cancels `call` (anything with cancel()) when it is still running `timeout` + `margin` seconds after the
    guard was made (margin None: OVERDUE_MARGIN); no guard when `timeout` is None. Use as a context manager around
    reading the call; `check` turns the error of a call it cancelled into DEADLINE_EXCEEDED."""

    def __init__(self, call: Any, timeout: Optional[float], what: str, margin: Optional[float] = None):
        margin = OVERDUE_MARGIN if margin is None else margin
        self._call = call
        self._timeout = timeout
        self._margin = margin
        self._what = what
        self._fired = threading.Event()
        self._timer: Optional[threading.Timer] = None
        if timeout is not None:
            self._timer = threading.Timer(timeout + margin, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        self._fired.set()
        self._call.cancel()

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def check(self, error: grpc.RpcError) -> errors.OrthoserveError:
        """The client's error for `error`, which ended the guarded call."""
        if self.fired:
            return errors.DeadlineExceededError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{self._what} was still running {self._margin:g} s past its deadline ({self._timeout:g} s), with no "
                "word from gRPC; the client cancelled it")
        return errors.error_from_rpc(error)

    def __enter__(self) -> "OverdueGuard":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
