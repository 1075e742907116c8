"""One matrix of a call (Entry): the spec and bytes sent, and how its result is rebuilt; and the checks that make
every result returned the result of what this rank sent (the integrity rules: client/python/README.md, "Integrity").

A result is checked before any of its bytes are taken: its index in range and not answered before (check_index),
and its name, global shape, N-d layout and block equal to the spec sent at that index (check_result; for a whole
matrix the block is its whole 2-D view). A mismatch raises orthoserve.IntegrityError and returns nothing.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import grpc

from orthoserve import arrays, errors
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

__all__ = ["Entry", "check_index", "check_batch_echo", "check_normalization_echo", "check_result", "in_region", "expected_bytes", "rebuild"]

_FLATTEN_LAYOUTS = (pb.ND_LAYOUT_UNSPECIFIED, pb.ND_LAYOUT_FLATTEN)  # Both mean "flatten" on the wire.


def _layout_name(value: int) -> str:
    return "batch" if value == pb.ND_LAYOUT_BATCH else "flatten" if value in _FLATTEN_LAYOUTS else f"unknown ({value})"


def _block_text(b: pb.Block) -> str:
    return f"{b.rows}x{b.cols} at ({b.row_offset}, {b.col_offset})"


class Entry:
    """One matrix of a step: its spec, the bytes to send, how to rebuild its result, and the block its result must
    say it holds (the spec's block for a group step, the whole 2-D view for a whole matrix)."""

    __slots__ = ("spec", "payload", "info", "result_shape", "block", "out")

    def __init__(self, spec: pb.MatrixSpec, payload: memoryview, info: arrays.ArrayInfo, result_shape,
                 block: Optional[pb.Block] = None, out: Any = None):
        self.spec = spec
        self.payload = payload  # Empty when the input is in a shared-memory region (spec.input_region).
        self.out = out  # The region-backed array the result is written into (spec.result_region), or None.
        self.info = info
        self.result_shape = result_shape
        if block is None:
            if spec.HasField("block"):
                block = spec.block
            else:
                nd = "batch" if spec.nd_layout == pb.ND_LAYOUT_BATCH else "flatten"
                rows, cols = arrays.matrix_view(tuple(spec.shape), nd)
                block = pb.Block(row_offset=0, col_offset=0, rows=rows, cols=cols)
        self.block = block


def check_index(index: int, entries: Sequence[Entry], seen: Any) -> None:
    """IntegrityError unless 0 <= index < len(entries) and index is not in `seen` (the indices answered so far)."""
    count = len(entries)
    if not 0 <= index < count:
        raise errors.integrity_error(f"the server answered with result index {index}, but this request has "
                                     f"{count} matrices (indices 0..{count - 1}); its results are not this "
                                     "caller's", index=index)
    if index in seen:
        raise errors.integrity_error(f"the server answered index {index} twice; its results are not this caller's",
                                     entries[index].spec.name, index)


def check_batch_echo(entry: Entry, result: pb.MatrixResult) -> None:
    """FailedPreconditionError when a batch (nd_layout=batch) was answered without nd_layout=batch."""
    if entry.spec.nd_layout == pb.ND_LAYOUT_BATCH and result.nd_layout != pb.ND_LAYOUT_BATCH:
        # A server that predates NdLayout ignores the field and answers for the flattened matrix: a different
        # computation, of the same size. Never return it as the batch's answer.
        raise errors.FailedPreconditionError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "the server did not read this tensor as a batch of matrices (its result does not echo nd_layout=batch: "
            "it predates MatrixSpec.nd_layout and computed the flattened matrix); upgrade the server, or send "
            "nd='flatten' if that is what you mean", entry.spec.name)


def check_normalization_echo(entry: Entry, result: pb.MatrixResult) -> None:
    """FailedPreconditionError when normalization bf16 was asked for and the result does not echo it."""
    if (entry.spec.options.normalization == pb.NORMALIZATION_BF16 and
            result.normalization != pb.NORMALIZATION_BF16):
        # A server that predates Normalization ignores the option and normalizes in fp32: another computation.
        raise errors.FailedPreconditionError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "the server did not normalize this matrix in bf16 (its result does not echo normalization=bf16: it "
            "predates NsOptions.normalization and normalized in fp32); upgrade the server, or send "
            "normalization='fp32'", entry.spec.name)


def check_result(entry: Entry, index: int, result: pb.MatrixResult) -> None:
    """IntegrityError unless `result` (a successful one) names what `entry` sent at `index`: name, global shape,
    N-d layout and block. FailedPreconditionError for a batch answered as a flattened matrix (check_batch_echo) and
    for a bf16 normalization answered without its echo (check_normalization_echo)."""
    check_batch_echo(entry, result)  # A server that predates NdLayout: its own, clearer error.
    check_normalization_echo(entry, result)
    spec, problems = entry.spec, []
    sent_batch = spec.nd_layout == pb.ND_LAYOUT_BATCH
    if result.name != spec.name:
        problems.append(f"name {result.name!r} (sent {spec.name!r})")
    if tuple(result.shape) != tuple(spec.shape):
        problems.append(f"shape {list(result.shape)} (sent {list(spec.shape)})")
    if result.nd_layout not in (*_FLATTEN_LAYOUTS, pb.ND_LAYOUT_BATCH) or (
            result.nd_layout == pb.ND_LAYOUT_BATCH and not sent_batch):
        problems.append(f"nd_layout {_layout_name(result.nd_layout)} (sent {_layout_name(spec.nd_layout)})")
    if result.block != entry.block:
        problems.append(f"block {_block_text(result.block)} (sent {_block_text(entry.block)})")
    if problems:
        raise errors.integrity_error(f"result index {index} is not the result of what this rank sent there: it has "
                                     f"{', '.join(problems)}; refusing to return it", spec.name, index)


def in_region(entry: Entry, result: pb.MatrixResult) -> Any:
    """The out array of a result the server wrote into its region; IntegrityError when the result does not
    say it is there."""
    if result.result_region != entry.spec.result_region or result.data:
        raise errors.integrity_error("the result was not written into the region slice this call named",
                                     entry.spec.name)
    return entry.out


def expected_bytes(entry: Entry, result: pb.MatrixResult) -> int:
    """The bytes of `entry`'s result as `result` describes it (its dtype, else the one sent)."""
    rows, cols = arrays.matrix_view(entry.result_shape) if len(entry.result_shape) >= 2 else (0, 0)
    dtype = result.dtype or entry.spec.dtype
    return rows * cols * arrays.ITEMSIZE.get(dtype, 0)


def rebuild(entry: Entry, result: pb.MatrixResult, buf: bytearray) -> Any:
    """The result array of `entry` from the result's bytes `buf` (the input's type, dtype and device).
    IntegrityError for another dtype than the one sent; InternalError for a wrong byte count."""
    if result.dtype not in (pb.DTYPE_UNSPECIFIED, entry.spec.dtype):
        raise errors.integrity_error(f"result dtype {result.dtype} differs from the sent {entry.spec.dtype}",
                                     entry.spec.name)
    check_batch_echo(entry, result)
    check_normalization_echo(entry, result)
    expected = expected_bytes(entry, result)
    if len(buf) != expected:
        raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                   f"result has {len(buf)} bytes, expected {expected}", entry.spec.name)
    return arrays.from_bytes(buf, entry.info, entry.result_shape)
