"""Exceptions of the orthoserve client: every failure carries its gRPC status code and the server's message."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import grpc

__all__ = [
    "OrthoserveError",
    "InvalidArgumentError",
    "ResourceExhaustedError",
    "UnavailableError",
    "AbortedError",
    "CancelledError",
    "DeadlineExceededError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "FailedPreconditionError",
    "InternalError",
    "UnimplementedError",
    "IntegrityError",
    "error_from_rpc",
    "error_from_code",
    "RETRYABLE_METADATA_KEY",
    "FLEET_CHANGE",
]

# Trailing metadata that makes an ABORTED call retryable: the step was cut short by a change of the fleet's
# membership (the service comment of proto/orthoserve/v1/orthogonalizer.proto).
RETRYABLE_METADATA_KEY = "orthoserve-retryable"
FLEET_CHANGE = "fleet-change"
# Trailing metadata of a transient RESOURCE_EXHAUSTED (a fair share or a limit used up for a moment): whole
# milliseconds after which a retry may succeed. Without it RESOURCE_EXHAUSTED is final (a request over any limit).
RETRY_AFTER_METADATA_KEY = "orthoserve-retry-after-ms"
_MAX_RETRY_AFTER_MS = 10_000


class OrthoserveError(Exception):
    """A failed call or a failed matrix.

    Attributes:
      code: the grpc.StatusCode (canonical code) the server (or gRPC) gave.
      message: the server's message (details), without the client's decoration.
      matrix: the name of the matrix the error is about, or None for a call-level error.
      fleet_change: the call's trailing metadata held `orthoserve-retryable: fleet-change`.
      retry_after: for a transient RESOURCE_EXHAUSTED, the server's delay in seconds before a retry may succeed
        (trailing metadata `orthoserve-retry-after-ms`), else None.
      attempts: how many attempts the call made under its retry policy (1 without retries); when more than
        one, str(error) says so ("after N attempts").
      retryable: whether the service allows retrying the call (see is_retryable).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, message: str, matrix: Optional[str] = None, *,
                 fleet_change: bool = False, attempts: int = 1, note: str = "",
                 retry_after: Optional[float] = None):
        self.code = code
        self.message = message
        self.matrix = matrix
        self.fleet_change = fleet_change
        self.retry_after = retry_after if code == grpc.StatusCode.RESOURCE_EXHAUSTED else None
        self.attempts = attempts
        where = f"matrix '{matrix}': " if matrix is not None else ""
        tried = f"after {attempts} attempts{f' ({note})' if note else ''}: " if attempts > 1 else ""
        super().__init__(f"{code.name}: {tried}{where}{message}")

    @property
    def retryable(self) -> bool:
        """A call-level UNAVAILABLE; ABORTED marked as a fleet change; CANCELLED (the client does not cancel its
        calls, so the server gave up on it: it was shutting down); RESOURCE_EXHAUSTED with the server's retry delay
        (retry_after). Per-matrix (in-band) errors are final."""
        return self.matrix is None and (self.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or
                                        (self.code == grpc.StatusCode.ABORTED and self.fleet_change) or
                                        self.retry_after is not None)

    def after_attempts(self, attempts: int, note: str = "") -> "OrthoserveError":
        """The same error (class, code, message, matrix, marks) saying it is the last of `attempts` attempts."""
        out = type(self)(self.code, self.message, self.matrix, fleet_change=self.fleet_change, attempts=attempts,
                         note=note, retry_after=self.retry_after)
        out.__cause__ = self.__cause__
        return out


class InvalidArgumentError(OrthoserveError):
    pass


class ResourceExhaustedError(OrthoserveError):
    pass


class UnavailableError(OrthoserveError):
    pass


class AbortedError(OrthoserveError):
    pass


class CancelledError(OrthoserveError):
    pass


class DeadlineExceededError(OrthoserveError):
    pass


class UnauthenticatedError(OrthoserveError):
    pass


class PermissionDeniedError(OrthoserveError):
    pass


class FailedPreconditionError(OrthoserveError):
    pass


class InternalError(OrthoserveError):
    pass


class UnimplementedError(OrthoserveError):
    pass


class IntegrityError(OrthoserveError):
    """A result that is provably not this caller's: its MatrixResult names another matrix, global shape, N-d layout
    or block than the one this rank sent at that index, or comes with an index that is out of range or repeated.
    The client never returns such data. Its code is DATA_LOSS (the server's answer is corrupt, not the request) and
    it is never retried: a server that answers one attempt with another caller's data cannot be trusted to answer
    the next one with this caller's.

    Attributes (besides OrthoserveError's): index, the MatrixResult.index the check failed on (None when the
    failure is not about one result).
    """

    def __init__(self, code: grpc.StatusCode, message: str, matrix: Optional[str] = None, *,
                 fleet_change: bool = False, attempts: int = 1, note: str = "", index: Optional[int] = None):
        super().__init__(code, message, matrix, fleet_change=fleet_change, attempts=attempts, note=note)
        self.index = index

    @property
    def retryable(self) -> bool:
        return False

    def after_attempts(self, attempts: int, note: str = "") -> "OrthoserveError":
        out = IntegrityError(self.code, self.message, self.matrix, fleet_change=self.fleet_change,
                             attempts=attempts, note=note, index=self.index)
        out.__cause__ = self.__cause__
        return out


def integrity_error(message: str, matrix: Optional[str] = None, index: Optional[int] = None) -> IntegrityError:
    """An IntegrityError (code DATA_LOSS) saying `message` about `matrix` (result `index`)."""
    return IntegrityError(grpc.StatusCode.DATA_LOSS, message, matrix, index=index)


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
}
_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def _make(code: grpc.StatusCode, message: str, matrix: Optional[str] = None,
          fleet_change: bool = False, retry_after: Optional[float] = None) -> OrthoserveError:
    return _BY_CODE.get(code, OrthoserveError)(code, message, matrix, fleet_change=fleet_change,
                                               retry_after=retry_after)


def error_from_code(code: int, message: str, matrix: Optional[str] = None) -> OrthoserveError:
    """The exception for an in-band google.rpc.Code integer (MatrixResult.code)."""
    if code not in _BY_VALUE:
        return _make(grpc.StatusCode.UNKNOWN, f"(code {code}) {message}", matrix)
    return _make(_BY_VALUE[code], message, matrix)


def error_from_rpc(error: grpc.RpcError) -> OrthoserveError:
    """The exception for a failed gRPC call (a grpc.RpcError that is also a grpc.Call)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    trailing = _trailing(error)
    return _make(code or grpc.StatusCode.UNKNOWN, details or "", fleet_change=_fleet_change(trailing),
                 retry_after=_retry_after(trailing))


def _trailing(error: grpc.RpcError) -> Sequence[Tuple[str, Any]]:
    try:
        return tuple(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else ()
    except Exception:  # noqa: BLE001 - a call without metadata
        return ()


def _fleet_change(trailing: Sequence[Tuple[str, Any]]) -> bool:
    return any(key == RETRYABLE_METADATA_KEY and value == FLEET_CHANGE for key, value in trailing)


def _retry_after(trailing: Sequence[Tuple[str, Any]]) -> Optional[float]:
    """The server's retry delay in seconds (RETRY_AFTER_METADATA_KEY: whole milliseconds, 1..10000), else None."""
    for key, value in trailing:
        if key == RETRY_AFTER_METADATA_KEY and isinstance(value, str) and value.isdigit():
            ms = int(value)
            if 1 <= ms <= _MAX_RETRY_AFTER_MS:
                return ms / 1000.0
    return None
