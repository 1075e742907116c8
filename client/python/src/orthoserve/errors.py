"""Exceptions of the orthoserve client: every failure carries its gRPC status code and the server's message."""

from __future__ import annotations

from typing import Optional

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
    "error_from_rpc",
    "error_from_code",
]


class OrthoserveError(Exception):
    """A failed call or a failed matrix.

    Attributes:
      code: the grpc.StatusCode (canonical code) the server (or gRPC) gave.
      message: the server's message (details), without the client's decoration.
      matrix: the name of the matrix the error is about, or None for a call-level error.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, message: str, matrix: Optional[str] = None):
        self.code = code
        self.message = message
        self.matrix = matrix
        where = f"matrix '{matrix}': " if matrix is not None else ""
        super().__init__(f"{code.name}: {where}{message}")


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


def _make(code: grpc.StatusCode, message: str, matrix: Optional[str] = None) -> OrthoserveError:
    return _BY_CODE.get(code, OrthoserveError)(code, message, matrix)


def error_from_code(code: int, message: str, matrix: Optional[str] = None) -> OrthoserveError:
    """The exception for an in-band google.rpc.Code integer (MatrixResult.code)."""
    if code not in _BY_VALUE:
        return _make(grpc.StatusCode.UNKNOWN, f"(code {code}) {message}", matrix)
    return _make(_BY_VALUE[code], message, matrix)


def error_from_rpc(error: grpc.RpcError) -> OrthoserveError:
    """The exception for a failed gRPC call (a grpc.RpcError that is also a grpc.Call)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return _make(code or grpc.StatusCode.UNKNOWN, details or "")
