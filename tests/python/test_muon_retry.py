"""orthoserve.torch.Muon.step is safe to call again after an error: a step whose remote orthogonalization fails (the
server down, an error answer, an answer the integrity checks refuse) leaves parameters, gradients and optimizer state
bit for bit as they were, and a step retried after that equals one step that succeeded at once. The "server" is the
fake of tests/python/fake_server.py, which echoes each update back (the orthogonalization is the identity), so the
expected values are exact."""

import socket

import grpc
import pytest
import torch

import orthoserve
from orthoserve.torch import Muon
from fake_server import Failure, FakeServer

SHAPES = [(6, 4), (3, 5), (4, 2, 3)]


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture()
def fake():
    s = FakeServer()
    yield s
    s.stop()


def make(client, settings, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]
    opt = Muon(params, client=client, lr=0.05, momentum=0.9, weight_decay=0.1, **settings)
    return params, opt


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def snapshot(params, opt):
    """Copies of everything a step may change: parameters, gradients, momentum buffers, the step count."""
    return ([p.detach().clone() for p in params], [p.grad.clone() for p in params],
            [opt.state[p]["momentum_buffer"].clone() if "momentum_buffer" in opt.state.get(p, {}) else None
             for p in params], opt._remote_steps)


def assert_identical(a, b):
    (pa, ga, ba, na), (pb, gb, bb, nb) = a, b
    assert na == nb
    for x, y in zip(pa + ga, pb + gb):
        assert torch.equal(x, y)
    for x, y in zip(ba, bb):
        assert (x is None and y is None) or torch.equal(x, y)


SETTINGS = [dict(weight_decay_method="decoupled"), dict(weight_decay_method="independent", nesterov=True),
            dict(weight_decay_method="l2"), dict(weight_decay_method="l2", nesterov=True)]


@pytest.mark.deadline(30)
@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("first_step", [True, False])  # Without, then with momentum buffers already there.
@pytest.mark.parametrize("failure", ["error", "integrity", "server down"])
def test_a_failed_step_changes_nothing_and_a_retry_equals_one_step(fake, settings, first_step, failure):
    policy = orthoserve.RetryPolicy(deadline=2.0, initial_backoff=0.001, max_backoff=0.005)
    with orthoserve.Client(fake.address, retry=policy) as client:
        params, opt = make(client, settings)
        ref_params, ref_opt = make(client, settings)
        if not first_step:
            for ps, o in ((params, opt), (ref_params, ref_opt)):
                set_grads(ps, 1)
                o.step()
        set_grads(params, 2)
        set_grads(ref_params, 2)
        before = snapshot(params, opt)
        assert_identical(before, snapshot(ref_params, ref_opt))

        if failure == "error":
            fake.servicer.fail(Failure(grpc.StatusCode.INVALID_ARGUMENT, "refused", method="stream"))
            expected = orthoserve.InvalidArgumentError
        elif failure == "integrity":
            fake.servicer.tamper = "block"
            expected = orthoserve.IntegrityError
        else:
            opt.client = orthoserve.Client(dead_address(), retry=False)
            expected = orthoserve.UnavailableError
        with pytest.raises(expected):
            opt.step()
        assert_identical(snapshot(params, opt), before)

        fake.servicer.tamper = None
        opt.client = client
        opt.step()  # The retry.
        ref_opt.step()  # One step that succeeded at once.
        after = snapshot(params, opt)
        assert_identical(after, snapshot(ref_params, ref_opt))
        # The step did something: the parameters moved, and the momentum buffers exist.
        assert not torch.equal(after[0][0], before[0][0]) and all(b is not None for b in after[2])


@pytest.mark.deadline(30)
def test_a_bad_parameter_found_mid_step_changes_nothing(fake):
    with orthoserve.Client(fake.address) as client:
        params, opt = make(client, dict(weight_decay_method="decoupled"))
        bad = torch.nn.Parameter(torch.zeros(2, 2))
        opt.add_param_group(dict(params=[bad]))
        set_grads(params, 2)
        bad.grad = torch.zeros(2, 2).to_sparse()  # Found after the other parameters were looked at.
        before = snapshot(params, opt)
        with pytest.raises(RuntimeError, match="sparse"):
            opt.step()
        assert_identical(snapshot(params, opt), before)
        assert fake.headers == []
