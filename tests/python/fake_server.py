"""A recording in-process Orthogonalizer for testing the client's side of the wire protocol (message order,
chunk sizes, headers, blocks, routing, error mapping, retries) without the C++ server. It echoes each block's
bytes back; numerics are tested against the real server elsewhere.

Failures are injected with fail(): each queued Failure fails the next call of its method (or of any method)
with its code, message and trailing metadata, after the call was recorded."""

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
        return pb.ServerInfo(version="fake", backend="cpu", fleet_rank=self.fleet_rank,
                             fleet_world=max(1, len(self.members)), members=self.members, ready=True,
                             fleet_generation=self.fleet_generation, limits=pb.Limits(chunk_bytes=self.chunk_bytes))

    def Orthogonalize(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        self._maybe_fail("unary", context)
        out = pb.OrthogonalizeResponse()
        for i, m in enumerate(request.matrices):
            out.results.add(index=i, name=m.spec.name, dtype=m.spec.dtype, shape=m.spec.shape, data=m.data,
                            nd_layout=m.spec.nd_layout if self.echo_nd_layout else 0)
        return out

    def OrthogonalizeStream(self, request_iterator, context):
        messages = list(request_iterator)
        with self.lock:
            self.streams.append(messages)
            self.metadata.append(dict(context.invocation_metadata()))
        self._maybe_fail("stream", context)
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
        for i in reversed(range(len(specs))):
            spec = specs[i]
            if spec.name.startswith("bad"):
                failed += 1
                yield pb.StreamResponse(result=pb.MatrixResult(index=i, name=spec.name, code=3,
                                                               message="block rows out of range"))
                continue
            yield pb.StreamResponse(result=pb.MatrixResult(index=i, name=spec.name, dtype=spec.dtype,
                                                           shape=spec.shape, block=spec.block,
                                                           nd_layout=spec.nd_layout if self.echo_nd_layout else 0))
            payload = data.get(i, b"")
            for start in range(0, len(payload), self.chunk_bytes):
                yield pb.StreamResponse(chunk=pb.DataChunk(index=i, data=payload[start:start + self.chunk_bytes]))
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
