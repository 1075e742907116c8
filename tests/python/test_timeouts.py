"""Clients that cannot hang (issue #26): the default per-attempt timeout, an attempt ended by it retried at another
address or fleet member while the retry deadline allows (and final after it), a server's own DEADLINE_EXCEEDED
final, and HTTP/2 keepalive ending a call whose peer stopped answering. Stalled servers are fake ones
(tests/python/fake_server.py) whose chosen calls never answer."""

import logging
import socket
import threading
import time

import grpc
import numpy as np
import pytest

import orthoserve
from orthoserve import client as client_lib, overdue
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from fake_server import Failure, FakeServer

M = np.arange(12, dtype=np.float32).reshape(3, 4)


def policy(deadline: float) -> orthoserve.RetryPolicy:
    return orthoserve.RetryPolicy(deadline=deadline, initial_backoff=0.001, max_backoff=0.005)


@pytest.fixture()
def servers():
    made = []

    def make(**kw):
        made.append(FakeServer(**kw))
        return made[-1]

    yield make
    for s in made:
        s.stop()


@pytest.mark.deadline(10)
def test_defaults():
    c = orthoserve.Client("127.0.0.1:1")
    assert c.timeout == orthoserve.DEFAULT_TIMEOUT == 90.0
    assert c.retry.deadline == 120.0
    # A call without a timeout of its own gets the client's on its first attempt.
    assert c.new_attempts(None, "call").timeout() == 90.0
    opts = dict(c._channel_options())
    assert (opts["grpc.keepalive_time_ms"], opts["grpc.keepalive_timeout_ms"], opts["grpc.http2.ping_timeout_ms"]) == (
        10_000, 5_000, 5_000)
    assert opts["grpc.keepalive_permit_without_calls"] == 0 and opts["grpc.http2.max_pings_without_data"] == 0
    opts = dict(orthoserve.Client("127.0.0.1:1", keepalive_time=None)._channel_options())
    assert not any(k.startswith("grpc.keepalive") or k == "grpc.http2.ping_timeout_ms" for k in opts)
    assert orthoserve.Client("127.0.0.1:1", timeout=None).timeout is None
    for kw in (dict(timeout=0), dict(timeout=-1), dict(keepalive_time=0), dict(keepalive_timeout=0)):
        with pytest.raises(ValueError):
            orthoserve.Client("127.0.0.1:1", **kw)


@pytest.mark.deadline(20)
@pytest.mark.parametrize("method", ["stream", "unary"])
def test_a_stalled_lone_attempt_times_out_and_goes_to_the_next_address(servers, method, caplog):
    a, b = servers(), servers()
    a.servicer.stall(method)
    with orthoserve.Client([a.address, b.address], timeout=0.5, retry=policy(10.0)) as client, \
            caplog.at_level(logging.WARNING, "orthoserve"):
        start = time.monotonic()
        [out] = client.orthogonalize([M], method=method)
        elapsed = time.monotonic() - start
        assert np.array_equal(out, M) and client.retries == 1
    assert 0.5 <= elapsed < 3.0
    assert a.servicer.stalled == [method] and b.servicer.calls.count(method) == 1
    if method == "stream":
        assert [h.attempt for h in b.headers] == [1]
    [line] = [r.getMessage() for r in caplog.records if r.name == "orthoserve"]
    assert a.address in line and "DEADLINE_EXCEEDED" in line and "attempt 0" in line


class _Cancelled(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self):
        return "Locally cancelled by application!"

    def trailing_metadata(self):
        return ()


class _SilentStream:
    """A stream call whose deadline event never arrives: reading it blocks until it is cancelled."""

    def __init__(self):
        self.cancelled = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        if not self.cancelled.wait(60):
            raise AssertionError("the silent stream was never cancelled")
        raise _Cancelled()

    def cancel(self):
        self.cancelled.set()
        return True


@pytest.mark.deadline(20)
def test_a_stream_whose_deadline_never_arrives_is_cancelled_a_margin_past_it_and_retried(servers, monkeypatch):
    a, b = servers(), servers()
    silent = _SilentStream()

    class Stub:  # a's stub, whose streams never end; its other methods are the real ones.
        def __init__(self, real):
            self._real = real

        def __getattr__(self, name):
            return getattr(self._real, name)

        def OrthogonalizeStream(self, requests, timeout=None, metadata=None):
            return silent

    monkeypatch.setattr(overdue, "OVERDUE_MARGIN", 0.3)
    with orthoserve.Client([a.address, b.address], timeout=0.5, retry=policy(10.0)) as client:
        real_stub = client._stub
        monkeypatch.setattr(client, "_stub", lambda address: Stub(real_stub(address)) if address == a.address
                            else real_stub(address))
        start = time.monotonic()
        [out] = client.orthogonalize([M], method="stream")
        elapsed = time.monotonic() - start
        assert np.array_equal(out, M) and client.retries == 1
    assert silent.cancelled.is_set()
    assert 0.8 <= elapsed < 5.0
    assert b.servicer.calls.count("stream") == 1 and [h.attempt for h in b.headers] == [1]


@pytest.mark.deadline(20)
def test_a_stalled_group_member_is_avoided_on_the_retry(servers):
    a, b = servers(fleet_rank=0), servers(fleet_rank=1)
    for s in (a, b):
        s.servicer.members = [pb.FleetMember(rank=0, address=a.address, ready=True),
                              pb.FleetMember(rank=1, address=b.address, ready=True)]
    b.servicer.stall("stream")  # b hangs but still says it is ready.
    with orthoserve.Client(a.address, timeout=0.5, retry=policy(10.0)) as client:
        group = client.group("job", "g", 1, 2, run_id="run-t")
        assert group.address == b.address
        [out] = group.step(3, [orthoserve.Shard("w", (6, 4), (3, 0), M)])
        assert np.array_equal(out, M) and client.retries == 1
        assert group.address == a.address
    assert b.servicer.stalled == ["stream"]
    assert [(h.step, h.rank, h.attempt) for h in a.headers] == [(3, 1, 1)]


@pytest.mark.deadline(10)
def test_a_group_retry_reads_the_membership_from_another_member_before_the_one_that_stalled(servers):
    # The stalled member is the client's first address, so it would be asked first; a stopped rank would hold
    # that read for its whole timeout.
    a, b = servers(fleet_rank=0), servers(fleet_rank=1)
    for s in (a, b):
        s.servicer.members = [pb.FleetMember(rank=0, address=a.address, ready=True),
                              pb.FleetMember(rank=1, address=b.address, ready=True)]
    with orthoserve.Client([b.address, a.address], timeout=0.5, retry=policy(10.0)) as client:
        group = client.group("job", "g", 1, 2, run_id="run-m")
        assert group.address == b.address
        b.servicer.stall("stream")
        b.servicer.stall("info")
        [out] = group.step(4, [orthoserve.Shard("w", (6, 4), (3, 0), M)])
        assert np.array_equal(out, M) and group.address == a.address
    assert b.servicer.stalled == ["stream"]


@pytest.mark.deadline(20)
def test_a_member_that_fails_is_avoided_even_when_the_membership_still_lists_it_ready(servers):
    a, b = servers(fleet_rank=0), servers(fleet_rank=1)
    for s in (a, b):
        s.servicer.members = [pb.FleetMember(rank=0, address=a.address, ready=True),
                              pb.FleetMember(rank=1, address=b.address, ready=True)]
    b.servicer.fail(Failure(grpc.StatusCode.UNAVAILABLE, "draining", method="stream"))
    with orthoserve.Client(a.address, retry=policy(10.0)) as client:
        group = client.group("job", "g", 1, 2, run_id="run-u")
        group.step(5, [orthoserve.Shard("w", (6, 4), (3, 0), M)])
        assert group.address == a.address
    assert [(h.step, h.attempt) for h in b.headers] == [(5, 0)]
    assert [(h.step, h.attempt) for h in a.headers] == [(5, 1)]


@pytest.mark.deadline(20)
def test_a_timeout_after_the_retry_deadline_is_final(servers):
    a = servers()
    a.servicer.stall("stream")
    with orthoserve.Client(a.address, timeout=0.4, retry=policy(1.0)) as client:
        start = time.monotonic()
        with pytest.raises(orthoserve.DeadlineExceededError) as err:
            client.orthogonalize([M])
        elapsed = time.monotonic() - start
    # 0.4 s, 0.4 s, then the last 0.2 s of the deadline: that one ran out of the retry deadline and is not retried.
    assert 0.95 <= elapsed < 2.5
    assert a.servicer.stalled == ["stream"] * 3 and err.value.attempts == 3
    assert "after 3 attempts (retry deadline of 1 s reached)" in str(err.value)


@pytest.mark.deadline(20)
def test_a_first_attempt_longer_than_the_retry_deadline_is_not_retried(servers):
    a = servers()
    a.servicer.stall("stream")
    with orthoserve.Client(a.address, timeout=0.6, retry=policy(0.5)) as client:
        with pytest.raises(orthoserve.DeadlineExceededError) as err:
            client.orthogonalize([M])
        assert client.retries == 0
    assert a.servicer.stalled == ["stream"] and err.value.attempts == 1


@pytest.mark.deadline(20)
def test_a_deadline_exceeded_from_the_server_is_final(servers):
    a = servers()
    a.servicer.fail(Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "collective timed out", method="stream"))
    with orthoserve.Client(a.address, timeout=5.0, retry=policy(10.0)) as client:
        with pytest.raises(orthoserve.DeadlineExceededError) as err:
            client.orthogonalize([M])
        assert client.retries == 0
    assert err.value.message == "collective timed out" and len(a.headers) == 1


@pytest.mark.deadline(20)
def test_timeouts_are_not_retried_when_retries_are_disabled(servers):
    a = servers()
    a.servicer.stall("stream")
    with orthoserve.Client(a.address, timeout=0.3, retry=False) as client:
        with pytest.raises(orthoserve.DeadlineExceededError) as err:
            client.orthogonalize([M])
    assert a.servicer.stalled == ["stream"] and err.value.attempts == 1


class FreezingProxy:
    """A loopback TCP proxy to `target` that forwards bytes both ways until freeze(), then forwards nothing while
    keeping every connection open: a peer that vanished without closing its connections."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self._sockets = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [conn, upstream]
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if self._frozen.is_set():
                continue  # Swallowed: the peer neither answers nor closes.
            try:
                dst.sendall(data)
            except OSError:
                return

    def freeze(self):
        self._frozen.set()

    def close(self):
        self._closed.set()
        self._listener.close()
        for s in self._sockets:
            s.close()


@pytest.mark.deadline(30)
def test_a_connection_attempt_to_a_server_that_never_answers_gives_up_as_keepalive_would(servers):
    a = servers()
    proxy = FreezingProxy(a.address)
    proxy.freeze()  # TCP connects, and nothing is ever answered: a stopped process.
    try:
        with orthoserve.Client(proxy.address, timeout=None, retry=False, keepalive_time=0.5,
                               keepalive_timeout=0.5) as client:
            start = time.monotonic()
            with pytest.raises(orthoserve.UnavailableError):
                client.info(refresh=True)
            elapsed = time.monotonic() - start
        assert elapsed < 10.0  # gRPC's own minimum connect timeout is 20 s.
    finally:
        proxy.close()


@pytest.mark.deadline(30)
def test_keepalive_ends_a_call_whose_peer_stopped_answering(servers):
    a = servers()
    a.servicer.stall("stream")
    proxy = FreezingProxy(a.address)
    try:
        # No per-attempt timeout and no retries: only keepalive can end this call.
        with orthoserve.Client(proxy.address, timeout=None, retry=False, keepalive_time=0.5,
                               keepalive_timeout=0.5) as client:
            client.info()  # Connected, and the chunk limit known.
            threading.Timer(0.3, proxy.freeze).start()
            start = time.monotonic()
            with pytest.raises(orthoserve.UnavailableError):
                client.orthogonalize([M])
            elapsed = time.monotonic() - start
        assert elapsed < 10.0
        assert a.servicer.stalled == ["stream"]
    finally:
        proxy.close()
