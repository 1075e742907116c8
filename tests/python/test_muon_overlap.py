"""orthoserve.torch.Muon with its orthogonalization overlapped with backward (overlap=, issue #41 item 1): in every
training loop below the overlapped optimizer ends with parameters and momentum buffers identical (torch.equal) to
the same loop run with overlap=False — the independent reference here is the synchronous step, itself checked against
torch.optim.Muon and Emerging-Optimizers elsewhere (test_muon_flavors.py) — and its overlap_stats say whether the
results sent during backward were used (the plain loop), or voided and recomputed by the step (clipping, a changed
momentum). A server rank killed during backward: the step is retried on the other address, or raises and changes
nothing. Hooks go with the optimizer (no leak, no thread left)."""

import gc
import threading
import weakref

import grpc
import pytest
import torch

import orthoserve
from orthoserve.torch import Muon, OverlapOptions
from orthoserve.torch import eo as eo_lib
from orthoserve.torch import optim as optim_lib
from conftest import start_server
from fake_server import Failure, FakeServer

SHAPES = [(24, 16), (16, 24), (16, 16), (3, 8, 8)]
N = len(SHAPES)
STEPS = 5
EACH = OverlapOptions(bucket_bytes=1)  # Every parameter its own bucket, sent by its own hook.
SETTINGS = [dict(), dict(flavor="torch"), dict(nesterov=True, weight_decay_method="l2", nd="batch"),
            dict(weight_decay_method="independent", scale_mode="shape_scaling", momentum=0.9)]


class _Kill(torch.autograd.Function):
    """The identity, whose backward calls `action` first (a server killed in the middle of backward)."""

    @staticmethod
    def forward(ctx, x, action):
        ctx.action = action
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.action is not None:
            ctx.action()
        return g, None


def make_params(seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((0.3 * torch.randn(s, generator=g)).to(device)) for s in SHAPES]


def loss_of(params, x, kill=None):
    """A small network of the parameters: backward reaches them one by one (the last layer's first)."""
    w0, w1, w2, w3 = params
    h = torch.tanh(x @ w1)  # (B, 24)
    if kill is not None:
        h = _Kill.apply(h, kill)
    h = torch.tanh(h @ w0)  # (B, 16)
    h = torch.tanh(h @ w2)
    return h.square().mean() + (w3.sum(0) @ h[:, :8].T).square().mean()


def snapshot(params, opt):
    return ([p.detach().clone() for p in params],
            [opt.state[p]["momentum_buffer"].clone() if "momentum_buffer" in opt.state.get(p, {}) else None
             for p in params])


def assert_identical(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert (x is None and y is None) or torch.equal(x, y)


def train(client, loop, overlap, settings=None, steps=STEPS, device="cpu"):
    """`steps` steps of training loop `loop`; returns (params, opt)."""
    params = make_params(device=device)
    opt = Muon(params, client=client, lr=0.02, overlap=overlap, **(settings or {}))
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(8, 16, generator=g).to(device)
        if loop == "closure":
            def closure():
                opt.zero_grad()
                loss = loss_of(params, x)
                loss.backward()
                return loss
            opt.step(closure)
            continue
        opt.zero_grad()
        if loop in ("accumulate", "accumulate_no_overlap"):
            first = opt.no_overlap() if loop == "accumulate_no_overlap" else _nothing()
            with first:
                (loss_of(params, x[:4]) / 2).backward()
            (loss_of(params, x[4:]) / 2).backward()
        elif loop == "second_backward":
            loss = loss_of(params, x)
            loss.backward(retain_graph=True)
            (0.5 * loss).backward()
        else:
            loss_of(params, x).backward()
        if loop == "clip" or (loop == "clip_first_steps" and step < 2):
            torch.nn.utils.clip_grad_norm_(params, 0.05)
        elif loop == "set_to_none" and step % 2 == 1:
            opt.zero_grad(set_to_none=True)
        elif loop == "zeroed" and step % 2 == 1:
            opt.zero_grad(set_to_none=False)
        elif loop == "lr_change":
            opt.param_groups[0]["lr"] = 0.02 * 0.8 ** step
        elif loop == "momentum_change":
            opt.param_groups[0]["momentum"] = 0.9 - 0.01 * (step + 1)
        opt.step()
    return params, opt


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.deadline(60)
@pytest.mark.parametrize("overlap", [EACH, True], ids=["bucket-per-parameter", "default-buckets"])
@pytest.mark.parametrize("settings", SETTINGS, ids=["eo", "torch", "l2-nesterov-batch", "independent"])
def test_overlapped_steps_are_the_synchronous_steps(client, settings, overlap):
    ref_params, ref_opt = train(client, "plain", False, settings)
    params, opt = train(client, "plain", overlap, settings)
    assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
    assert ref_opt.overlap_stats == orthoserve.torch.OverlapStats()
    stats = opt.overlap_stats
    # Every update of every step came from a send made during backward.
    assert (stats.computed, stats.used, stats.stale, stats.failed) == (N * STEPS, N * STEPS, 0, 0)
    assert stats.buckets == (N * STEPS if overlap is EACH else STEPS)


@pytest.mark.deadline(60)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("side_stream", [False, True])
def test_cuda_parameters_overlap_with_the_same_numbers(client, side_stream):
    """CUDA parameters (their updates leave after an event on the hook's stream; results are copied back before the
    step reads them), with the whole loop on the default stream or on a side stream."""
    def run(overlap):
        with torch.cuda.stream(torch.cuda.Stream() if side_stream else torch.cuda.current_stream()):
            params, opt = train(client, "plain", overlap, device="cuda")
        torch.cuda.synchronize()
        return params, opt

    ref_params, ref_opt = run(False)
    params, opt = run(EACH)
    assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
    assert opt.overlap_stats.used == N * STEPS


@pytest.mark.deadline(30)
def test_the_buckets_leave_during_backward(client):
    params = make_params()
    opt = Muon(params, client=client, lr=0.02, overlap=EACH)
    loss_of(params, torch.randn(8, 16)).backward()
    # Before step(): every parameter's bucket was handed to the send threads by its hook or the end of backward.
    assert opt.overlap_stats.buckets == N and opt.overlap_stats.used == 0
    opt.step()
    assert opt.overlap_stats.used == N


# loop -> (used, stale, superseded, idle_steps) over STEPS steps. A step that uses no early result and finds some
# stale makes the hooks rest 1, then 2, 4, ... steps (overlap._MAX_IDLE_STEPS): steps 0 and 2 try, 1, 3 and 4 rest.
LOOPS = {
    "accumulate": (N * STEPS, 0, N * STEPS, 0),  # The first micro-batch's sends are voided by the second's.
    "accumulate_no_overlap": (N * STEPS, 0, 0, 0),  # The first micro-batch sends nothing.
    "second_backward": (N * STEPS, 0, N * STEPS, 0),
    "clip": (0, N * 2, 0, 3),  # clip_grad_norm_ changes every gradient in place after its send.
    "clip_first_steps": (N * 3, N, 0, 1),  # Step 0 voided, 1 rests (clipped too), 2-4 unclipped: used again.
    "set_to_none": (N, N * 2, 0, 2),  # Odd steps have no gradients (the sends dropped); step 2 rests, 4 too.
    "zeroed": (N, N * 2, 0, 2),  # Odd steps step with zeroed gradients, recomputed; step 2 rests, 4 too.
    "closure": (N * STEPS, 0, 0, 0),
    "lr_change": (N * STEPS, 0, 0, 0),  # lr enters when the step applies the update, not the update.
    "momentum_change": (0, N * 2, 0, 3),  # Changed between backward and step: recomputed.
}


@pytest.mark.deadline(60)
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_training_loops_overlap_or_fall_back_with_the_same_numbers(client, loop):
    settings = dict(nesterov=True, weight_decay_method="l2", momentum=0.9)
    ref_params, ref_opt = train(client, loop, False, settings)
    params, opt = train(client, loop, EACH, settings)
    assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
    stats = opt.overlap_stats
    assert (stats.used, stats.stale, stats.superseded, stats.idle_steps, stats.failed) == (*LOOPS[loop], 0)


@pytest.mark.deadline(30)
@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE])
def test_a_failed_early_send_is_sent_again_by_the_step(code):
    """The fake echoes updates (its orthogonalization is the identity). The early send's call fails: a final error is
    the step's to send again; a retryable one is retried by the early send itself, under the client's policy."""
    fake = FakeServer()
    policy = orthoserve.RetryPolicy(deadline=5.0, initial_backoff=0.001, max_backoff=0.005)
    try:
        with orthoserve.Client(fake.address, retry=policy) as client:
            ref_params, ref_opt = train(client, "plain", False, steps=1)
            fake.servicer.fail(Failure(code, "injected", method="stream"))
            params, opt = train(client, "plain", True, steps=1)
            assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
            stats = opt.overlap_stats
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                assert (stats.used, stats.failed) == (0, N)
            else:
                assert (stats.used, stats.failed) == (N, 0) and client.retries == 1
    finally:
        fake.stop()


def _killer(server):
    def kill():
        if server.proc.poll() is None:
            server.proc.kill()  # Our own server process, by its pid.
            server.proc.wait()
    return kill


@pytest.mark.deadline(60)
def test_a_rank_killed_during_backward_is_failed_over(tmp_path):
    a, b = start_server(tmp_path, name="a"), start_server(tmp_path, name="b")
    policy = orthoserve.RetryPolicy(deadline=10.0, initial_backoff=0.01, max_backoff=0.05)
    try:
        with orthoserve.Client([a.address, b.address], retry=policy, timeout=10) as client, \
                orthoserve.Client(b.address) as ref_client:
            params = make_params()
            opt = Muon(params, client=client, lr=0.02, overlap=EACH)
            ref_params = make_params()
            ref_opt = Muon(ref_params, client=ref_client, lr=0.02, overlap=False)
            x = torch.randn(8, 16)
            loss_of(params, x, kill=_killer(a)).backward()
            assert a.proc.poll() is not None
            opt.step()
            loss_of(ref_params, x).backward()
            ref_opt.step()
            assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
            assert not torch.equal(params[0], make_params()[0])
            assert client.retries >= 1  # w1's send, after the kill, went to a first and was retried on b.
    finally:
        a.stop()
        b.stop()


@pytest.mark.deadline(60)
def test_a_rank_killed_during_backward_fails_the_step_which_changes_nothing(tmp_path):
    a, b = start_server(tmp_path, name="a"), start_server(tmp_path, name="b")
    policy = orthoserve.RetryPolicy(deadline=1.0, initial_backoff=0.01, max_backoff=0.05)
    try:
        with orthoserve.Client(a.address, retry=policy, timeout=5) as client, \
                orthoserve.Client(b.address) as other:
            params = make_params()
            opt = Muon(params, client=client, lr=0.02, momentum=0.9, overlap=EACH)
            ref_params = make_params()
            ref_opt = Muon(ref_params, client=other, lr=0.02, momentum=0.9, overlap=False)
            x = torch.randn(8, 16)
            for ps, o in ((params, opt), (ref_params, ref_opt)):  # A first step, so momentum buffers exist.
                loss_of(ps, x).backward()
                o.step()
            before = snapshot(params, opt)
            loss_of(params, x, kill=_killer(a)).backward()  # Accumulates into the gradients.
            grads = [p.grad.clone() for p in params]
            with pytest.raises(orthoserve.UnavailableError):
                opt.step()
            assert_identical(snapshot(params, opt), before)
            assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
            # Calling step() again, now with a live server, is the one step that succeeded.
            opt.client = other
            opt.step()
            loss_of(ref_params, x).backward()
            ref_opt.step()
            assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
    finally:
        a.stop()
        b.stop()


def _overlap_threads():
    return [t for t in threading.enumerate() if t.name.startswith("orthoserve-overlap")]


@pytest.mark.deadline(30)
def test_the_hooks_go_with_the_optimizer(client):
    model = torch.nn.Sequential(torch.nn.Linear(16, 24, bias=False), torch.nn.Tanh(), torch.nn.Linear(24, 8,
                                                                                                     bias=False))
    opt = Muon(model.parameters(), client=client, lr=0.02, overlap=EACH)
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    assert opt.overlap_stats.used == 2 and _overlap_threads()
    assert all(p._post_accumulate_grad_hooks for p in model.parameters())
    gone = weakref.ref(opt)
    del opt
    gc.collect()
    assert gone() is None
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())
    for t in _overlap_threads():
        t.join(5)
    assert not _overlap_threads()
    model(torch.randn(4, 16)).square().mean().backward()  # No hook left to call.
    model_gone = weakref.ref(model)
    del model
    gc.collect()
    assert model_gone() is None


def test_overlap_opt_out(monkeypatch):
    params = make_params()
    opt = Muon(params, overlap=False)
    assert not opt.overlap and not any(p._post_accumulate_grad_hooks for p in params)
    assert Muon(params).overlap  # The default.
    assert not optim_lib.Muon([params[0]], overlap=False).overlap
    assert not eo_lib.Muon(params, overlap=False).overlap
    monkeypatch.setenv("ORTHOSERVE_OVERLAP", "0")
    assert not Muon(params).overlap and Muon(params, overlap=True).overlap
    monkeypatch.setenv("ORTHOSERVE_OVERLAP", "maybe")
    with pytest.raises(ValueError, match="ORTHOSERVE_OVERLAP"):
        Muon(params)
    with pytest.raises(ValueError, match="bucket_bytes"):
        OverlapOptions(bucket_bytes=0)
    with pytest.raises(TypeError, match="overlap"):
        Muon(params, overlap="yes")


@pytest.mark.deadline(60)
def test_torch_distributed_jobs_keep_the_synchronous_step(client, tmp_path):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        params, opt = train(client, "plain", True, steps=2)
    finally:
        dist.destroy_process_group()
    ref_params, ref_opt = train(client, "plain", False, steps=2)
    assert_identical(snapshot(params, opt), snapshot(ref_params, ref_opt))
    assert opt.overlap_stats.computed == 0
