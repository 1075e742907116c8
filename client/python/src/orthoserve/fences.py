"""Fences: a shared-memory slice belongs to its call until the call has ended (docs/shared_memory.md, "Fences").

Every attempt that names region slices carries a call id of its own (new_call_id). When such an attempt fails — an
error from the server, a deadline that ran out here, a broken connection — the server may still be computing it and
write its result into the slice later, over whatever the caller put there next. So before the failure is reported or
the call retried, the client fences the attempt (fence): SharedMemory.FenceCall marks the id fenced on the server (a
late message of it takes nothing) and answers once the server holds none of its slices. Only then are the slices the
caller's again.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any, Sequence

import grpc

from orthoserve import errors
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

_log = logging.getLogger("orthoserve")

# How long a client tries to fence a failed attempt (Client's fence_timeout default), seconds.
DEFAULT_FENCE_TIMEOUT = 120.0

# The codes on which a fence is tried again: the server could not be reached, or it still computed the call when
# the fence's own deadline passed.
_AGAIN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def new_call_id() -> str:
    """A fresh call id: 128 random bits, hex."""
    return secrets.token_hex(16)


def names_slices(specs: Sequence[pb.MatrixSpec]) -> bool:
    """Whether any of `specs` names a region slice (an input or a result in a region)."""
    return any(s.HasField("input_region") or s.HasField("result_region") for s in specs)


def fence(channel: grpc.Channel, metadata: Any, address: str, call_id: str, failed: errors.OrthoserveError, *,
          fence_timeout: float, attempt_timeout: float | None) -> errors.OrthoserveError:
    """Fences the failed attempt `call_id` at `address` and returns the error to report for it: `failed` itself once
    the server holds none of its slices, else a FailedPreconditionError (final: not retried) saying that its slices
    may still be written. Tries again on UNAVAILABLE and DEADLINE_EXCEEDED, with a pause doubling from 50 ms to 2 s,
    until `fence_timeout` seconds have passed; each try is bounded by `attempt_timeout` (None: by what is left)."""
    stub = pb_grpc.SharedMemoryStub(channel)
    deadline = time.monotonic() + fence_timeout
    pause, tries = 0.05, 0
    while True:
        tries += 1
        left = max(deadline - time.monotonic(), 0.001)
        try:
            stub.FenceCall(pb.FenceCallRequest(call_id=call_id), metadata=metadata,
                           timeout=left if attempt_timeout is None else min(attempt_timeout, left))
            return failed  # The server holds none of its slices: the failure is all there is.
        except grpc.RpcError as e:
            error = errors.error_from_rpc(e)
        if error.code not in _AGAIN or time.monotonic() + pause >= deadline:
            break
        _log.warning("fencing a failed call that named shared-memory slices on %s: %s; trying again", address, error)
        time.sleep(pause)
        pause = min(2 * pause, 2.0)
    return errors.FailedPreconditionError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{failed}; and its shared-memory slices may still be written by the server at {address}: fencing the call "
        f"(FenceCall) failed after {tries} tries: {error}. Do not reuse the slices this call named (use another "
        f"region, or wait and fence again)", failed.matrix)
