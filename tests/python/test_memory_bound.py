"""The server's memory stays within the bound docs/operations.md states ("Memory bound") under 50
concurrent maximum-size calls, unary and streaming, from outside, on the real binary: a unary body is
read only once room for it is reserved, and a stream's matrix only once its bytes are admitted.

The bound, for the flags below: --max-inflight-bytes (what calls hold) × 1.25 (gRPC's and the
allocator's overhead on held bytes) + --stream-buffer-idle-bytes (0 here) + 8 MiB for each call
waiting for room (its HTTP/2 flow-control window, which gRPC sizes; about 4 MiB measured on loopback).
Without the reservation the server held every body at once: 50 × 16 MiB, twice over."""

import threading

import grpc
import numpy as np
import pytest

from conftest import start_server
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

MIB = 1 << 20
INFLIGHT = 64 * MIB
MESSAGE = 16 * MIB
CALLS = 50
ROWS, COLS = 2048, 2040  # float32: just under 16 MiB, so that request and response fit MESSAGE.
BOUND = int(1.25 * INFLIGHT) + CALLS * 8 * MIB


def _kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"{key} missing from /proc/{pid}/status")


@pytest.fixture()
def bounded_server(tmp_path):
    server = start_server(tmp_path, extra_args=[
        f"--max-inflight-bytes={INFLIGHT}", f"--max-tenant-inflight-bytes={INFLIGHT}",
        f"--max-message-bytes={MESSAGE}", "--stream-buffer-idle-bytes=0", f"--max-concurrent-streams={CALLS + 10}",
        "--workers=2"])
    yield server
    server.stop()


def _spec(name: str) -> pb.MatrixSpec:
    # steps = 0: normalization and scaling only, so that the test measures holding bytes, not compute.
    return pb.MatrixSpec(name=name, shape=[ROWS, COLS], dtype=pb.DTYPE_FP32,
                         options=pb.NsOptions(steps=0, precision=pb.PRECISION_HIGHEST))


def _run_concurrently(call):
    outcomes = []
    lock = threading.Lock()

    def one(i):
        try:
            call(i)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        with lock:
            outcomes.append(code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(outcomes) == CALLS, "a call did not end within 300 s"
    return outcomes


def _channel(server):
    return grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 2 * MESSAGE),
                                                          ("grpc.max_receive_message_length", 2 * MESSAGE)])


def test_fifty_maximum_size_unary_calls_wait_for_room_instead_of_being_held_at_once(bounded_server):
    pid = bounded_server.proc.pid
    data = np.random.default_rng(1).standard_normal((ROWS, COLS), dtype=np.float32).tobytes()
    request = pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=_spec("w"), data=data)])
    with _channel(bounded_server) as channel:
        stub = pb_grpc.OrthogonalizerStub(channel)
        stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=_spec("warm"), data=data)]), timeout=60)
        before = _kib(pid, "VmRSS")
        outcomes = _run_concurrently(lambda i: stub.Orthogonalize(request, timeout=240))
    peak = _kib(pid, "VmHWM")
    # Every call is served: a call without room waits for it (in arrival order) rather than being refused.
    assert outcomes == [grpc.StatusCode.OK] * CALLS
    assert peak - before <= BOUND, f"RSS grew by {(peak - before) / MIB:.0f} MiB, over the bound of {BOUND / MIB:.0f} MiB"


def test_fifty_maximum_size_streams_stay_within_the_same_bound(bounded_server):
    pid = bounded_server.proc.pid
    data = np.random.default_rng(2).standard_normal((ROWS, COLS), dtype=np.float32).tobytes()
    chunk = 4 * MIB - 1024

    def messages():
        yield pb.StreamRequest(header=pb.StepHeader(num_matrices=1))
        yield pb.StreamRequest(spec=_spec("w"))
        for offset in range(0, len(data), chunk):
            yield pb.StreamRequest(chunk=pb.DataChunk(index=0, data=data[offset:offset + chunk]))
        yield pb.StreamRequest(end=pb.StepEnd())

    with _channel(bounded_server) as channel:
        stub = pb_grpc.OrthogonalizerStub(channel)
        before = _kib(pid, "VmRSS")

        def stream(i):
            responses = list(stub.OrthogonalizeStream(messages(), timeout=240))
            assert responses[-1].HasField("summary")

        outcomes = _run_concurrently(stream)
    peak = _kib(pid, "VmHWM")
    # A stream whose matrix finds no room is refused (RESOURCE_EXHAUSTED) before its bytes are taken.
    assert set(outcomes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grpc.StatusCode.OK in outcomes
    assert peak - before <= BOUND, f"RSS grew by {(peak - before) / MIB:.0f} MiB, over the bound of {BOUND / MIB:.0f} MiB"
