"""A transient RESOURCE_EXHAUSTED (a tenant's fair share or a limit used up for a moment) carries the server's retry
delay (trailing metadata `orthoserve-retry-after-ms`): the client retries it after at least that delay, `fallback`
covers it, and with retries off the error says how long to wait. A RESOURCE_EXHAUSTED that no wait cures (a matrix
over --max-matrix-elements) carries none and stays final. Against a real server on loopback."""

import time

import numpy as np
import pytest

import orthoserve
from orthoserve import errors

from conftest import start_server

# A tenant may start one call per second: the second call of a burst is refused for the rest of that second.
RATE = ("--max-tenant-calls-per-second", "1")


def matrix(seed=0, shape=(8, 12)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def rate_limited(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("rate"), RATE + ("--max-matrix-elements", "4096"))
    yield server
    server.stop()


@pytest.mark.deadline(60)
def test_the_refusal_carries_the_servers_delay_and_retries_off_keep_it(rate_limited):
    with orthoserve.Client(rate_limited.address, retry=orthoserve.RetryPolicy(enabled=False)) as client:
        time.sleep(1.1)  # A fresh second for this tenant.
        client.orthogonalize([matrix()])
        with pytest.raises(errors.ResourceExhaustedError) as refused:
            client.orthogonalize([matrix()])
    e = refused.value
    assert "--max-tenant-calls-per-second" in e.message
    assert e.retry_after is not None and 0 < e.retry_after <= 1.0
    assert e.retryable


@pytest.mark.deadline(60)
def test_a_burst_is_retried_after_the_delay_and_every_call_answers(rate_limited):
    with orthoserve.Client(rate_limited.address) as client:
        time.sleep(1.1)
        start = time.monotonic()
        for seed in range(3):  # Three calls at one per second: the 2nd and 3rd wait for their second.
            out = client.orthogonalize([matrix(seed)])[0]
            assert out.shape == (8, 12) and np.isfinite(out).all()
        took = time.monotonic() - start
        assert client.retries >= 2
    assert 1.8 <= took <= 10.0, took


@pytest.mark.deadline(60)
def test_a_refusal_no_wait_cures_is_final(rate_limited):
    with orthoserve.Client(rate_limited.address) as client:
        time.sleep(1.1)
        with pytest.raises(errors.ResourceExhaustedError) as refused:
            client.orthogonalize([matrix(shape=(80, 80))])  # 6400 elements > --max-matrix-elements 4096.
        assert client.retries == 0
    assert refused.value.retry_after is None and not refused.value.retryable


def test_the_delay_is_read_only_from_its_key_and_in_range():
    class Rpc:
        def __init__(self, trailing):
            self._trailing = trailing

        def code(self):
            import grpc
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self):
            return "busy"

        def trailing_metadata(self):
            return self._trailing

    assert errors.error_from_rpc(Rpc((("orthoserve-retry-after-ms", "250"),))).retry_after == 0.25
    for bad in ("0", "10001", "soon", "-5", ""):
        assert errors.error_from_rpc(Rpc((("orthoserve-retry-after-ms", bad),))).retry_after is None
    assert errors.error_from_rpc(Rpc((("x-retry-after-ms", "250"),))).retry_after is None
    assert errors.error_from_rpc(Rpc(())).retryable is False


def test_fallback_covers_a_transient_refusal_only():
    import grpc
    from orthoserve.torch.fallback import falls_back
    busy = errors.ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "fair share used up", retry_after=0.2)
    with pytest.warns(RuntimeWarning, match="computing it locally"):
        assert falls_back(True, busy, "Muon step 1")
    too_big = errors.ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "over --max-matrix-elements")
    assert not falls_back(True, too_big, "Muon step 1")
