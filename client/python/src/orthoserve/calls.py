"""One attempt of each matrix call on the wire: OrthogonalizeStream (stream: header, (spec, chunks)*, end; results
collected by index) and Orthogonalize (unary: one message each way). Each result is checked against its entry
(orthoserve.entries) before any of its bytes are taken, and rebuilt, or taken from the region it was written to.
Retries, routing and the choice of stub are the caller's (orthoserve.client)."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import grpc

from orthoserve import entries as entries_lib, errors, overdue
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc
from orthoserve.channels import Metadata
from orthoserve.entries import Entry

__all__ = ["stream", "unary"]


def _requests(header: pb.StepHeader, entries: List[Entry], chunk: int) -> Iterator[pb.StreamRequest]:
    yield pb.StreamRequest(header=header)
    for index, e in enumerate(entries):
        yield pb.StreamRequest(spec=e.spec)
        payload = e.payload
        for start in range(0, len(payload), chunk):
            yield pb.StreamRequest(chunk=pb.DataChunk(index=index, data=bytes(payload[start:start + chunk])))
    yield pb.StreamRequest(end=pb.StepEnd())


class _Answers:
    """The results and data chunks of one stream, by index, as they arrive."""

    def __init__(self, entries: List[Entry]):
        self.entries = entries
        self.results: Dict[int, pb.MatrixResult] = {}
        self.buffers: Dict[int, bytearray] = {}
        self.filled: Dict[int, int] = {}

    def take_result(self, r: pb.MatrixResult) -> None:
        entries_lib.check_index(r.index, self.entries, self.results)
        self.results[r.index] = r
        if r.code == 0:
            # Checked before any of its bytes are taken: data of another matrix is never assembled.
            entries_lib.check_result(self.entries[r.index], r.index, r)
            # A result in a region has no chunks: an empty buffer takes none.
            in_region = self.entries[r.index].out is not None
            self.buffers[r.index] = bytearray(0 if in_region else
                                              entries_lib.expected_bytes(self.entries[r.index], r))
            self.filled[r.index] = 0

    def take_chunk(self, c: pb.DataChunk) -> None:
        buf = self.buffers.get(c.index)
        if buf is None or self.filled[c.index] + len(c.data) > len(buf):
            raise errors.InternalError(grpc.StatusCode.INTERNAL, f"unexpected data chunk for matrix index {c.index}")
        buf[self.filled[c.index]:self.filled[c.index] + len(c.data)] = c.data
        self.filled[c.index] += len(c.data)

    def outcome(self) -> List[Any]:
        """The results in order once the stream ended: the first failed matrix's error, or each result."""
        results, buffers, filled = self.results, self.buffers, self.filled
        failed = [i for i in sorted(results) if results[i].code != 0]
        if failed:
            first = results[failed[0]]
            more = f" (and {len(failed) - 1} more failed matrices)" if len(failed) > 1 else ""
            raise errors.error_from_code(first.code, first.message + more, self.entries[failed[0]].spec.name)
        out = []
        for i, e in enumerate(self.entries):
            if i not in results:
                raise errors.InternalError(grpc.StatusCode.INTERNAL, "the server returned no result", e.spec.name)
            if filled[i] != len(buffers[i]):
                raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                           f"received {filled[i]} of {len(buffers[i])} result bytes", e.spec.name)
            r = results[i]
            out.append(entries_lib.in_region(e, r) if e.out is not None else entries_lib.rebuild(e, r, buffers[i]))
        return out


def stream(stub: pb_grpc.OrthogonalizerStub, address: str, header: pb.StepHeader, entries: List[Entry],
           timeout: Optional[float], chunk: int, metadata: Metadata) -> List[Any]:
    """One attempt of one OrthogonalizeStream step (header, (spec, chunks of at most `chunk` bytes)*, end) on `stub`
    (to `address`), bounded by `timeout`; returns the results in order. Raises OrthoserveError."""
    answers = _Answers(entries)
    summary = None
    call = stub.OrthogonalizeStream(_requests(header, entries, chunk), timeout=timeout, metadata=metadata)
    with overdue.OverdueGuard(call, timeout, f"the stream to {address}") as guard:
        try:
            for response in call:
                kind = response.WhichOneof("kind")
                if kind == "result":
                    answers.take_result(response.result)
                elif kind == "chunk":
                    answers.take_chunk(response.chunk)
                elif kind == "summary":
                    summary = response.summary
        except grpc.RpcError as e:
            raise guard.check(e) from None
        except errors.OrthoserveError:
            call.cancel()  # The answer is refused (a wrong index, result or chunk): nothing more of it is read.
            raise
    if summary is None:
        raise errors.InternalError(grpc.StatusCode.INTERNAL, "the stream ended without a step summary")
    return answers.outcome()


def unary(stub: pb_grpc.OrthogonalizerStub, entries: List[Entry], timeout: Optional[float],
          metadata: Metadata, call_id: str = "") -> List[Any]:
    """One Orthogonalize call of `entries` on `stub` under `call_id` ("" for none; orthoserve.fences), bounded by
    `timeout`; returns the results in order. Raises OrthoserveError."""
    request = pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=e.spec, data=bytes(e.payload)) for e in entries],
                                      call_id=call_id)
    try:
        response = stub.Orthogonalize(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as e:
        raise errors.error_from_rpc(e) from None
    by_index: Dict[int, pb.MatrixResult] = {}
    for r in response.results:
        entries_lib.check_index(r.index, entries, by_index)
        by_index[r.index] = r
    out = []
    for i, e in enumerate(entries):
        r = by_index.get(i)
        if r is None:
            raise errors.InternalError(grpc.StatusCode.INTERNAL, "the server returned no result", e.spec.name)
        if r.code != 0:
            raise errors.error_from_code(r.code, r.message, e.spec.name)
        entries_lib.check_result(e, i, r)
        out.append(entries_lib.in_region(e, r) if e.out is not None else entries_lib.rebuild(e, r, bytearray(r.data)))
    return out
