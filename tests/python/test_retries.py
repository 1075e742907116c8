"""The client's retries against fake servers (tests/python/fake_server.py) that fail chosen calls: which codes are
retried (UNAVAILABLE; ABORTED only with `orthoserve-retryable: fleet-change`), StepHeader.attempt counting up,
the overall deadline and max_attempts, disabled retries, per-attempt timeouts (more in test_timeouts.py), lone
fail-over to other addresses and fleet members, the logged and counted retries, and a group step re-routed when members' ready flags change.
Backoffs are a few milliseconds, so the suite stays fast."""

import logging
import socket
import time

import grpc
import numpy as np
import pytest

import orthoserve
from orthoserve import routing
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from fake_server import FLEET_CHANGE, Failure, FakeServer

FAST = orthoserve.RetryPolicy(deadline=5.0, initial_backoff=0.001, max_backoff=0.005)
M = np.arange(12, dtype=np.float32).reshape(3, 4)


def dead_address() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture()
def fake():
    s = FakeServer()
    yield s
    s.stop()


def unavailable(n, method="stream"):
    return [Failure(grpc.StatusCode.UNAVAILABLE, f"rank draining {i}", method=method) for i in range(n)]


def test_default_policy():
    p = orthoserve.RetryPolicy()
    assert (p.enabled, p.deadline, p.initial_backoff, p.max_backoff, p.multiplier, p.max_attempts) == (
        True, 120.0, 0.1, 2.0, 2.0, None)
    assert [p.backoff_bound(k) for k in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0])
    assert orthoserve.Client("127.0.0.1:1").retry == p
    assert not orthoserve.Client("127.0.0.1:1", retry=False).retry.enabled


@pytest.mark.parametrize("kw", [dict(deadline=0), dict(initial_backoff=-1), dict(max_backoff=0.01),
                                dict(multiplier=0.5), dict(max_attempts=0)])
def test_bad_policies_are_rejected(kw):
    with pytest.raises(ValueError):
        orthoserve.RetryPolicy(**kw)


def test_bad_retry_argument():
    with pytest.raises(TypeError):
        orthoserve.Client("127.0.0.1:1", retry="yes")


def test_unavailable_is_retried_with_attempt_counting_up(fake, caplog):
    fake.servicer.fail(*unavailable(2))
    with orthoserve.Client(fake.address, retry=FAST) as client, caplog.at_level(logging.WARNING, "orthoserve"):
        [out] = client.orthogonalize([M])
        assert np.array_equal(out, M)
        assert client.retries == 2
    assert [h.attempt for h in fake.headers] == [0, 1, 2]
    assert all(h.world == 1 and h.num_matrices == 1 for h in fake.headers)
    lines = [r.getMessage() for r in caplog.records if r.name == "orthoserve"]
    assert len(lines) == 2
    assert "attempt 0" in lines[0] and "UNAVAILABLE" in lines[0] and "rank draining 0" in lines[0]
    assert "attempt 1" in lines[1] and "retrying in" in lines[1]


def test_aborted_with_fleet_change_is_retried(fake):
    fake.servicer.fail(Failure(grpc.StatusCode.ABORTED, "fleet changed", FLEET_CHANGE, method="stream"))
    with orthoserve.Client(fake.address, retry=FAST) as client:
        [out] = client.group("job", "g", 0, 1).step(4, [orthoserve.Shard("w", (3, 4), (0, 0), M)])
        assert np.array_equal(out, M) and client.retries == 1
    assert [(h.step, h.attempt) for h in fake.headers] == [(4, 0), (4, 1)]


@pytest.mark.parametrize("code,error", [(grpc.StatusCode.ABORTED, orthoserve.AbortedError),
                                        (grpc.StatusCode.INVALID_ARGUMENT, orthoserve.InvalidArgumentError),
                                        (grpc.StatusCode.RESOURCE_EXHAUSTED, orthoserve.ResourceExhaustedError)])
def test_other_failures_are_final(fake, code, error):
    fake.servicer.fail(Failure(code, "no retry for this", method="stream"))
    with orthoserve.Client(fake.address, retry=FAST) as client:
        with pytest.raises(error) as err:
            client.orthogonalize([M])
        assert client.retries == 0
    assert err.value.code == code and err.value.message == "no retry for this"
    assert err.value.attempts == 1 and "attempts" not in str(err.value)
    assert not err.value.retryable
    assert len(fake.headers) == 1


def test_fleet_change_mark_on_other_codes_does_not_make_them_retryable(fake):
    fake.servicer.fail(Failure(grpc.StatusCode.INTERNAL, "boom", FLEET_CHANGE, method="stream"))
    with orthoserve.Client(fake.address, retry=FAST) as client:
        with pytest.raises(orthoserve.InternalError):
            client.orthogonalize([M])
    assert len(fake.headers) == 1


def test_a_final_error_after_retries_names_the_attempts(fake):
    fake.servicer.fail(*unavailable(1), Failure(grpc.StatusCode.INVALID_ARGUMENT, "bad spec", method="stream"))
    with orthoserve.Client(fake.address, retry=FAST) as client:
        with pytest.raises(orthoserve.InvalidArgumentError) as err:
            client.orthogonalize([M])
    assert err.value.attempts == 2 and "after 2 attempts: bad spec" in str(err.value)
    assert err.value.message == "bad spec"


def test_per_matrix_errors_are_final(fake):
    with orthoserve.Client(fake.address, retry=FAST) as client:
        with pytest.raises(orthoserve.InvalidArgumentError) as err:
            client.orthogonalize([M], name="bad")
        assert client.retries == 0
    assert err.value.matrix == "bad"


def test_deadline_bounds_all_attempts(fake):
    fake.servicer.fail(*unavailable(10_000))
    policy = orthoserve.RetryPolicy(deadline=0.3, initial_backoff=0.01, max_backoff=0.02)
    with orthoserve.Client(fake.address, retry=policy) as client:
        start = time.monotonic()
        with pytest.raises(orthoserve.UnavailableError) as err:
            client.orthogonalize([M])
        elapsed = time.monotonic() - start
    assert elapsed < 2.0
    n = len(fake.headers)
    assert n >= 3 and err.value.attempts == n and client.retries == n - 1
    assert f"after {n} attempts (retry deadline of 0.3 s reached)" in str(err.value)
    assert [h.attempt for h in fake.headers] == list(range(n))


def test_a_retry_cut_short_by_the_deadline_reports_the_unavailable_service():
    """A retry whose timeout is what remains of the retry deadline, and that runs out of it, failed because the
    service stayed unavailable: that failure is reported (not the DEADLINE_EXCEEDED of the cut attempt); a
    DEADLINE_EXCEEDED before the call's own timeout ran out (the server's) stays final, while one after it is
    retried. No retry starts with almost nothing left."""
    from orthoserve import errors, retry

    policy = orthoserve.RetryPolicy(deadline=0.3, initial_backoff=0.01, max_backoff=0.01)
    unavailable_error = errors.UnavailableError(grpc.StatusCode.UNAVAILABLE, "rank draining")
    expired = errors.DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    attempts = retry.Attempts(policy, None, "call")
    timeouts = []
    while True:
        timeouts.append(attempts.timeout())
        error = unavailable_error if attempts.number < 2 else expired  # The third attempt runs out of time.
        if not attempts.back_off(error):
            final = attempts.give_up(error)
            break
    assert timeouts[0] is None and all(t is not None and t >= 0.03 - 0.005 for t in timeouts[1:]), timeouts
    assert isinstance(final, errors.UnavailableError) and final.attempts == 3
    assert "after 3 attempts (retry deadline of 0.3 s reached)" in str(final)
    # A DEADLINE_EXCEEDED well before the call's own timeout (shorter than what remains of the deadline) ran out came
    # from the server: final as it is. After the timeout ran out, the same code is the attempt's timeout: retried.
    attempts = retry.Attempts(policy, 0.05, "call")
    attempts.timeout()
    assert attempts.back_off(unavailable_error)
    assert attempts.timeout() == 0.05
    assert not attempts.back_off(expired)
    assert isinstance(attempts.give_up(expired), errors.DeadlineExceededError)
    attempts = retry.Attempts(policy, 0.05, "call")
    assert attempts.timeout() == 0.05
    time.sleep(0.05)
    assert attempts.back_off(expired) and attempts.number == 1
    # Retries stop while a useful attempt still fits: never a retry with under a tenth of the deadline left.
    attempts = retry.Attempts(orthoserve.RetryPolicy(deadline=0.3, initial_backoff=0.02, max_backoff=0.02), None,
                              "call")
    while attempts.back_off(unavailable_error):
        # back_off checked the tenth when it decided; timeout() reads the clock a moment later (5 ms of slack: a
        # loaded 2-core CI machine once took 0.14 ms to get there, and 0.0299 s were left).
        assert attempts.timeout() >= 0.03 - 0.005


def test_max_attempts(fake):
    fake.servicer.fail(*unavailable(10))
    with orthoserve.Client(fake.address, retry=orthoserve.RetryPolicy(initial_backoff=0.001, max_backoff=0.001,
                                                                      max_attempts=3)) as client:
        with pytest.raises(orthoserve.UnavailableError) as err:
            client.orthogonalize([M])
    assert len(fake.headers) == 3 and "after 3 attempts (max_attempts 3 reached)" in str(err.value)


@pytest.mark.parametrize("retry", [False, orthoserve.RetryPolicy(enabled=False)])
def test_disabled(fake, retry):
    fake.servicer.fail(*unavailable(1))
    with orthoserve.Client(fake.address, retry=retry) as client:
        with pytest.raises(orthoserve.UnavailableError) as err:
            client.orthogonalize([M])
        assert client.retries == 0
    assert len(fake.headers) == 1 and err.value.attempts == 1 and err.value.retryable


@pytest.mark.deadline(20)
def test_each_attempt_is_bounded_by_the_call_timeout(fake):
    # The fake sleeps 2 s on job "slow": each attempt ends after 0.2 s and is retried until the 1 s retry deadline.
    policy = orthoserve.RetryPolicy(deadline=1.0, initial_backoff=0.001, max_backoff=0.005)
    with orthoserve.Client(fake.address, timeout=0.2, retry=policy) as client:
        start = time.monotonic()
        with pytest.raises(orthoserve.DeadlineExceededError) as err:
            client.group("slow", "g", 0, 1).step(1, [orthoserve.Shard("w", (3, 4), (0, 0), M)])
        assert time.monotonic() - start < 1.5 and client.retries >= 3
    assert err.value.attempts == client.retries + 1
    # Each attempt went out with its number (the last one's may still be arriving at the fake as the call ends).
    assert [h.attempt for h in fake.headers] == list(range(len(fake.headers))) and len(fake.headers) >= 3
    assert "retry deadline of 1 s reached" in str(err.value)


def test_unary_and_info_are_retried(fake):
    fake.servicer.fail(*unavailable(1, "unary"), *unavailable(2, "info"))
    with orthoserve.Client(fake.address, retry=FAST) as client:
        [out] = client.orthogonalize([M], method="unary")
        assert np.array_equal(out, M)
        assert client.info(refresh=True).version == "fake"
        assert client.retries == 3
    assert fake.servicer.calls == ["unary", "unary", "info", "info", "info"]


def test_lone_requests_fail_over_to_the_next_address(fake):
    with orthoserve.Client([dead_address(), fake.address], retry=FAST) as client:
        assert np.array_equal(client.orthogonalize([M])[0], M)
        assert client.retries == 1
        # The address that answered is used first from now on.
        assert np.array_equal(client.orthogonalize([M])[0], M)
        assert client.retries == 1
    assert [h.attempt for h in fake.headers] == [1, 0]


@pytest.mark.deadline(30)
def test_lone_requests_fail_over_to_ready_fleet_members():
    # The stream to `a` as it stops once hung with no deadline (6 minutes, until the suite's timeout); each attempt
    # now has one (the client's default, 90 s; 5 s here), and one that runs out goes to the next member.
    a, b, c = FakeServer(), FakeServer(fleet_rank=1), FakeServer(fleet_rank=2)
    try:
        members = [pb.FleetMember(rank=0, address=a.address, ready=True),
                   pb.FleetMember(rank=1, address=b.address, ready=False),
                   pb.FleetMember(rank=2, address=c.address, ready=True)]
        a.servicer.members = members
        with orthoserve.Client(a.address, timeout=5.0, retry=FAST) as client:
            client.info()
            a.stop()
            assert np.array_equal(client.orthogonalize([M])[0], M)
        assert b.headers == [] and [h.attempt for h in c.headers] == [1]
    finally:
        for s in (a, b, c):
            s.stop()


def test_routing_rule():
    def info(ready):
        return pb.ServerInfo(members=[pb.FleetMember(rank=r, address=f"h:{r}", ready=ok)
                                      for r, ok in reversed(list(enumerate(ready)))])

    assert [routing.preferred_address(info([1, 1, 1, 1]), r, 2, []) for r in range(2)] == ["h:0", "h:2"]
    assert [routing.preferred_address(info([1, 0, 1, 1]), r, 3, []) for r in range(3)] == ["h:0", "h:2", "h:3"]
    assert [routing.preferred_address(info([0, 0, 1, 0]), r, 4, []) for r in range(4)] == ["h:2"] * 4
    # None marked ready: every member.
    assert [routing.preferred_address(info([0, 0]), r, 2, []) for r in range(2)] == ["h:0", "h:1"]
    # No members: the client's addresses by the same rule.
    assert routing.preferred_address(pb.ServerInfo(), 1, 2, ["x:1", "x:2"]) == "x:2"


def test_group_step_rerouted_after_ready_flags_change():
    a, b = FakeServer(fleet_rank=0), FakeServer(fleet_rank=1)
    try:
        def members(b_ready, generation):
            for s in (a, b):
                s.servicer.members = [pb.FleetMember(rank=0, address=a.address, ready=True),
                                      pb.FleetMember(rank=1, address=b.address, ready=b_ready)]
                s.servicer.fleet_generation = generation

        members(True, 1)
        # b leaves the fleet while rank 1's step is in flight: the step fails with the fleet-change mark.
        b.servicer.fail(Failure(grpc.StatusCode.ABORTED, "member left", FLEET_CHANGE, method="stream",
                                before=lambda: members(False, 2)))
        with orthoserve.Client(a.address, retry=FAST) as client:
            group = client.group("job", "g", 1, 2, run_id="run-r")
            assert group.address == b.address
            [out] = group.step(9, [orthoserve.Shard("w", (6, 4), (3, 0), M)])
            assert np.array_equal(out, M)
            assert group.address == a.address and client.retries == 1
            # b rejoins: after the next failure, rank 1 goes back to it.
            members(True, 3)
            a.servicer.fail(*unavailable(1))
            group.step(10, [orthoserve.Shard("w", (6, 4), (3, 0), M)])
            assert group.address == b.address
        assert [(h.step, h.rank, h.attempt) for h in b.headers] == [(9, 1, 0), (10, 1, 1)]
        assert [(h.step, h.rank, h.attempt) for h in a.headers] == [(9, 1, 1), (10, 1, 0)]
        assert {h.run_id for h in a.headers + b.headers} == {"run-r"}  # The run id on every attempt.
    finally:
        a.stop()
        b.stop()


def test_group_membership_is_read_from_any_reachable_address():
    a, b = FakeServer(fleet_rank=0), FakeServer(fleet_rank=1)
    try:
        for s in (a, b):
            s.servicer.members = [pb.FleetMember(rank=0, address=a.address, ready=True),
                                  pb.FleetMember(rank=1, address=b.address, ready=True)]
        with orthoserve.Client(a.address, retry=FAST) as client:
            group = client.group("job", "g", 0, 2, run_id="run-m")
            assert group.address == a.address
            a.stop()  # The client's only address is gone; b still knows the membership.
            for s in (b,):
                s.servicer.members = [pb.FleetMember(rank=0, address=a.address, ready=False),
                                      pb.FleetMember(rank=1, address=b.address, ready=True)]
            [out] = group.step(1, [orthoserve.Shard("w", (6, 4), (0, 0), M)])
            assert np.array_equal(out, M) and group.address == b.address
        assert [(h.rank, h.attempt, h.run_id) for h in b.headers] == [(0, 1, "run-m")]
    finally:
        a.stop()
        b.stop()
