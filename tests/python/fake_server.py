"""A recording in-process Orthogonalizer for testing the client's side of the wire protocol (message order,
chunk sizes, headers, blocks, routing, error mapping, retries) without the C++ server. It echoes each block's
bytes back; numerics are tested against the real server elsewhere.

Failures are injected with fail(): each queued Failure fails the next call of its method (or of any method)
with its code, message and trailing metadata, after the call was recorded. Stalls are injected with stall(): the
next calls of a method are recorded and then never answered (each waits until the client's deadline or cancel, or
the server's stop, ends it), as a server that hangs would. Wrong answers are injected with
`servicer.tamper` (see TAMPERS): every call's result for its highest index is altered that way, so that the client's
integrity checks can be shown to catch each."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from concurrent import futures
from typing import Callable, Deque, List, Optional, Tuple

import grpc

from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc


FLEET_CHANGE = (("orthoserve-retryable", "fleet-change"),)

# How servicer.tamper alters the result of the highest index of each call (None: answers are faithful):
#   "block"      another block (one row further down, or the wrong extent)     "name"   another matrix's name
#   "shape"      another global shape                                          "nd_layout"  batch for flatten
#   "duplicate"  the result (and its data) sent twice                          "index"  an index out of range
TAMPERS = ("block", "name", "shape", "nd_layout", "duplicate", "index")


def whole_block(spec: pb.MatrixSpec, echo_nd_layout: bool = True) -> pb.Block:
    """The block a server's result names: the spec's own for a group step, else the whole 2-D view of the shape (by
    spec.nd_layout; flattened when the server predates NdLayout, echo_nd_layout False)."""
    if spec.HasField("block"):
        return spec.block
    shape = list(spec.shape)
    if len(shape) < 2:
        return pb.Block()
    if echo_nd_layout and spec.nd_layout == pb.ND_LAYOUT_BATCH:
        rows, cols = 1, shape[-1]
        for d in shape[:-1]:
            rows *= d
    else:
        rows, cols = shape[0], 1
        for d in shape[1:]:
            cols *= d
    return pb.Block(row_offset=0, col_offset=0, rows=rows, cols=cols)


def tampered(result: pb.MatrixResult, how: str, count: int) -> pb.MatrixResult:
    """A copy of `result` altered as TAMPERS says (a call of `count` matrices; "duplicate": an unaltered copy)."""
    out = pb.MatrixResult()
    out.CopyFrom(result)
    if how == "block":
        out.block.row_offset += 1
    elif how == "name":
        out.name = result.name + "-of-another-run"
    elif how == "shape":
        out.shape[0] += 1
    elif how == "nd_layout":
        out.nd_layout = pb.ND_LAYOUT_BATCH
    elif how == "duplicate":
        pass
    elif how == "index":
        out.index = count
    else:
        raise ValueError(f"fake_server: unknown tamper {how!r}; one of {TAMPERS}")
    return out


@dataclasses.dataclass
class Failure:
    code: grpc.StatusCode
    message: str = "injected failure"
    metadata: Tuple[Tuple[str, str], ...] = ()  # Trailing metadata, e.g. FLEET_CHANGE.
    method: Optional[str] = None  # "info", "unary", "stream" or None (any).
    before: Optional[Callable[[], None]] = None  # Runs just before failing (e.g. to change the membership).


class RecordingServicer(pb_grpc.OrthogonalizerServicer):
    def __init__(self, chunk_bytes: int, fleet_rank: int = 0):
        self.chunk_bytes = chunk_bytes
        self.fleet_rank = fleet_rank
        self.fleet_generation = 1
        self.members: List[pb.FleetMember] = []
        self.streams: List[List[pb.StreamRequest]] = []
        self.metadata: List[dict] = []
        self.calls: List[str] = []  # Every call's method ("info", "unary", "stream"), in order.
        self.failures: Deque[Failure] = collections.deque()
        self.lock = threading.Lock()
        # Whether results echo MatrixSpec.nd_layout, as servers do since NdLayout exists (False: an
        # older server, which reads every tensor flattened and leaves MatrixResult.nd_layout unset).
        self.echo_nd_layout = True
        self.echo_normalization = True  # False: a server older than NsOptions.normalization.
        self.tamper: Optional[str] = None  # One of TAMPERS, or None.
        self.stalls: dict = {}  # Method -> how many of its next calls are never answered.
        self.stalled: List[str] = []  # Every call that stalled, by method, in order.

    def stall(self, method: str, count: int = 1 << 30) -> None:
        """Makes the next `count` calls of `method` ("info", "unary", "stream") hang (every one by default)."""
        with self.lock:
            self.stalls[method] = count

    def _maybe_stall(self, method: str, context) -> bool:
        """Waits while the call is alive when `method` is to stall (a minute at most, so a broken test cannot keep a
        thread forever); True when it stalled."""
        with self.lock:
            left = self.stalls.get(method, 0)
            if left <= 0:
                return False
            self.stalls[method] = left - 1
            self.stalled.append(method)
        end = time.monotonic() + 60
        while context.is_active() and time.monotonic() < end:
            time.sleep(0.01)
        return True

    def fail(self, *failures: Failure) -> None:
        with self.lock:
            self.failures.extend(failures)

    def _maybe_fail(self, method: str, context) -> None:
        with self.lock:
            self.calls.append(method)
            failure = None
            if self.failures and self.failures[0].method in (None, method):
                failure = self.failures.popleft()
        if failure is None:
            return
        if failure.before is not None:
            failure.before()
        if failure.metadata:
            context.set_trailing_metadata(failure.metadata)
        context.abort(failure.code, failure.message)

    def GetServerInfo(self, request, context):
        self._maybe_fail("info", context)
        if self._maybe_stall("info", context):
            context.abort(grpc.StatusCode.CANCELLED, "stalled call ended")
        return pb.ServerInfo(version="fake", backend="cpu", fleet_rank=self.fleet_rank,
                             fleet_world=max(1, len(self.members)), members=self.members, ready=True,
                             fleet_generation=self.fleet_generation, limits=pb.Limits(chunk_bytes=self.chunk_bytes))

    def Orthogonalize(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        self._maybe_fail("unary", context)
        if self._maybe_stall("unary", context):
            context.abort(grpc.StatusCode.CANCELLED, "stalled call ended")
        out = pb.OrthogonalizeResponse()
        count = len(request.matrices)
        for i, m in enumerate(request.matrices):
            r = pb.MatrixResult(index=i, name=m.spec.name, dtype=m.spec.dtype, shape=m.spec.shape, data=m.data,
                                nd_layout=m.spec.nd_layout if self.echo_nd_layout else 0,
                                normalization=m.spec.options.normalization if self.echo_normalization else 0,
                                block=whole_block(m.spec, self.echo_nd_layout))
            if self.tamper is not None and i == count - 1:
                if self.tamper == "duplicate":
                    out.results.add().CopyFrom(r)
                else:
                    r = tampered(r, self.tamper, count)
            out.results.add().CopyFrom(r)
        return out

    def OrthogonalizeStream(self, request_iterator, context):
        messages = list(request_iterator)
        with self.lock:
            self.streams.append(messages)
            self.metadata.append(dict(context.invocation_metadata()))
        self._maybe_fail("stream", context)
        if self._maybe_stall("stream", context):
            return
        header = messages[0].header
        if header.job == "abort":
            context.abort(grpc.StatusCode.ABORTED, "step 3 of group g aborted: trainer ranks [1] missing")
        if header.job == "slow":
            time.sleep(2)
        specs, data = [], {}
        for m in messages[1:]:
            kind = m.WhichOneof("kind")
            if kind == "spec":
                specs.append(m.spec)
            elif kind == "chunk":
                data[m.chunk.index] = data.get(m.chunk.index, b"") + m.chunk.data
        # Answer in reverse order: results may come in any order.
        failed = 0
        count = len(specs)
        for i in reversed(range(count)):
            spec = specs[i]
            if spec.name.startswith("bad"):
                failed += 1
                yield pb.StreamResponse(result=pb.MatrixResult(index=i, name=spec.name, code=3,
                                                               message="block rows out of range"))
                continue
            result = pb.MatrixResult(index=i, name=spec.name, dtype=spec.dtype, shape=spec.shape,
                                     block=whole_block(spec, self.echo_nd_layout),
                                     nd_layout=spec.nd_layout if self.echo_nd_layout else 0,
                                     normalization=spec.options.normalization if self.echo_normalization else 0)
            answers = [result]
            if self.tamper is not None and i == count - 1:
                answers = [tampered(result, self.tamper, count)]
                if self.tamper == "duplicate":
                    answers.insert(0, result)
            payload = data.get(i, b"")
            for answer in answers:
                yield pb.StreamResponse(result=answer)
                for start in range(0, len(payload), self.chunk_bytes):
                    yield pb.StreamResponse(chunk=pb.DataChunk(index=answer.index,
                                                               data=payload[start:start + self.chunk_bytes]))
        yield pb.StreamResponse(summary=pb.StepSummary(matrices_ok=len(specs) - failed, matrices_failed=failed,
                                                       fleet_rank=self.fleet_rank))


class FakeServer:
    def __init__(self, chunk_bytes: int = 1000, fleet_rank: int = 0, port: int = 0):
        self.servicer = RecordingServicer(chunk_bytes, fleet_rank)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_OrthogonalizerServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    @property
    def headers(self) -> List[pb.StepHeader]:
        """The header of every stream received, in order."""
        return [messages[0].header for messages in self.servicer.streams]

    def stop(self):
        self.server.stop(0)
