"""The client returns only results that are provably its own: against a fake server that answers with another
block, another matrix's name, another shape or layout, an index twice or one out of range (fake_server.TAMPERS),
every kind of call — a group step and a lone stream, a lone unary call — raises orthoserve.IntegrityError naming the
matrix and the field, makes no retry, and returns nothing. The same fake server answering faithfully is accepted
(the checks do not refuse good answers)."""

import grpc
import numpy as np
import pytest

import orthoserve
from fake_server import TAMPERS, FakeServer

pytestmark = pytest.mark.deadline(30)

RETRYING = orthoserve.RetryPolicy(initial_backoff=0.0, max_backoff=0.0, deadline=10)
M = np.arange(24, dtype=np.float32).reshape(6, 4)
N = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
# What each tamper's message must name (the field and the value this rank sent).
SAYS = {"block": "block", "name": "name", "shape": "shape", "nd_layout": "nd_layout", "duplicate": "twice",
        "index": "result index 2"}


@pytest.fixture()
def fake():
    s = FakeServer(chunk_bytes=40)
    yield s
    s.stop()


def group_step(client):
    group = client.group("job", "g", 1, 2, run_id="integrity")
    return group.step(5, [orthoserve.Shard("a", (12, 4), (6, 0), M), orthoserve.Shard("b", (6, 8), (0, 4), M)])


def lone_stream(client):
    return client.orthogonalize([M, N])


def lone_unary(client):
    return client.orthogonalize([M, N], method="unary")


CALLS = {"group step": group_step, "lone stream": lone_stream, "lone unary": lone_unary}


@pytest.mark.parametrize("call", list(CALLS))
def test_faithful_answers_are_returned(fake, call):
    with orthoserve.Client(fake.address, retry=RETRYING) as client:
        out = CALLS[call](client)
    assert np.array_equal(out[0], M)
    assert np.array_equal(out[1], M if call == "group step" else N)


@pytest.mark.parametrize("tamper", TAMPERS)
@pytest.mark.parametrize("call", list(CALLS))
def test_a_result_that_is_not_this_callers_raises_integrity_error(fake, call, tamper):
    fake.servicer.tamper = tamper
    calls_before = len(fake.servicer.calls)
    with orthoserve.Client(fake.address, retry=RETRYING) as client:
        with pytest.raises(orthoserve.IntegrityError) as err:
            CALLS[call](client)
        assert client.retries == 0
    e = err.value
    assert isinstance(e, orthoserve.OrthoserveError) and not e.retryable
    assert e.code == grpc.StatusCode.DATA_LOSS
    assert SAYS[tamper] in e.message, e.message
    # The tampered answer is the one for the highest index (1); "index" moves it out of range (2 of 2).
    assert e.index == (2 if tamper == "index" else 1)
    if tamper != "index":
        assert e.matrix == ("b" if call == "group step" else "m1")
    # One attempt, no retry: the calls are GetServerInfo (stream chunk size) and the one step.
    assert [c for c in fake.servicer.calls[calls_before:] if c != "info"] == ["unary" if call == "lone unary" else
                                                                              "stream"]


def test_a_wrong_block_message_names_both_blocks(fake):
    fake.servicer.tamper = "block"
    with orthoserve.Client(fake.address) as client:
        with pytest.raises(orthoserve.IntegrityError) as err:
            group_step(client)
    assert "block 6x4 at (1, 4) (sent 6x4 at (0, 4))" in err.value.message, err.value.message
    assert "refusing to return it" in str(err.value)


def test_integrity_error_keeps_its_class_after_retries():
    e = orthoserve.IntegrityError(grpc.StatusCode.DATA_LOSS, "wrong block", "w", index=3)
    again = e.after_attempts(2)
    assert isinstance(again, orthoserve.IntegrityError) and again.index == 3 and not again.retryable
    assert "after 2 attempts" in str(again)
