"""orthoserve.local_ns (the trainer-side fallback) against Emerging-Optimizers and the server: HIGHEST within
1e-5 of both (as the other EO comparisons), MEDIUM within a few bf16 ulps; every coefficient set, scale mode,
eps mode, transpose, split_qkv, half dtypes, N-d; and the fallback of RemoteNewtonSchulz and Muon: off by
default, on only for a service that stays unreachable, with a warning."""

import logging

import grpc
import pytest
import torch

import oracle
import orthoserve
from orthoserve import local_ns
from orthoserve.torch import Muon, RemoteNewtonSchulz
from fake_server import Failure, FakeServer
from test_retries import dead_address

TOL = 1e-5
NO_WAIT = orthoserve.RetryPolicy(deadline=0.2, initial_backoff=0.001, max_backoff=0.01)


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


def medium_tol(ref):
    return 4 * 2 ** -8 * ref.abs().max().item()


@pytest.mark.parametrize("coefficient_type", oracle.COEFFICIENT_TYPES)
@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (32, 32)])
def test_highest_matches_emerging_optimizers(coefficient_type, shape):
    x = rand(*shape, seed=len(coefficient_type))
    custom = oracle.CUSTOM if coefficient_type == "custom" else None
    for steps in (5, 11):
        ref = oracle.newton_schulz(x, steps=steps, coefficient_type=coefficient_type, custom=custom)
        out = local_ns.orthogonalize(x, coefficients=coefficient_type, custom_coefficients=custom, steps=steps,
                                     precision="highest", scale_mode="none")
        assert max_err(out, ref) <= TOL, (coefficient_type, shape, steps)


@pytest.mark.parametrize("scale_mode", oracle.SCALE_MODES)
def test_scale_modes_match_emerging_optimizers(scale_mode):
    for shape in [(16, 48), (48, 16)]:
        x = rand(*shape, seed=3)
        out = local_ns.orthogonalize(x, precision="highest", scale_mode=scale_mode, extra_scale=0.2)
        assert max_err(out, oracle.scaled(x, scale_mode, extra=0.2)) <= TOL


def test_medium_tracks_emerging_optimizers_bf16_path():
    x = rand(32, 48, seed=13)
    ref = oracle.newton_schulz(x, precision="medium")
    assert max_err(local_ns.orthogonalize(x, precision="medium", scale_mode="none"), ref) <= medium_tol(ref)


CASES = [
    dict(),
    dict(coefficients="cubic5", steps=5),
    dict(coefficients="deepseekv4", steps=30),
    dict(coefficients="polar_express", steps=11, scale_mode="unit_rms_norm", extra_scale=0.3),
    dict(eps_mode="add", eps=1e-3, scale_mode="shape_scaling"),
    dict(transpose="on"),
    dict(transpose=False, steps=3),
    dict(steps=0),
    dict(split_qkv=[4, 2, 2]),
    dict(custom_coefficients=oracle.CUSTOM, steps=7),
]


@pytest.mark.parametrize("precision", ["highest", "medium"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_matches_the_server(client, case, precision):
    for shape, seed in [((24, 40), 1), ((48, 20), 2), ((16, 3, 5), 3)]:
        x = rand(*shape, seed=seed)
        opts = dict(case, precision=precision)
        ours = local_ns.orthogonalize(x, **opts)
        theirs = client.orthogonalize([x], **opts)[0]
        assert ours.shape == x.shape and ours.dtype == x.dtype
        tol = TOL * max(1.0, theirs.abs().max().item()) if precision == "highest" else medium_tol(theirs)
        assert max_err(ours, theirs) <= tol, (shape, opts)


@pytest.mark.parametrize("case", [dict(), dict(eps_mode="add", eps=1e-3), dict(steps=0), dict(transpose="on")],
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_bf16_normalization_matches_the_server(client, case):
    # torch.optim.Muon's order (normalization "bf16", medium only). With no steps the result is the normalized matrix
    # itself: bit for bit the server's. With steps, as MEDIUM tracks the server.
    for shape, seed in [((24, 40), 1), ((48, 20), 2)]:
        x = rand(*shape, seed=seed)
        opts = dict(case, precision="medium", normalization="bf16")
        ours = local_ns.orthogonalize(x, **opts)
        theirs = client.orthogonalize([x], **opts)[0]
        if case.get("steps") == 0:
            assert torch.equal(ours, theirs), shape
            assert not torch.equal(theirs, client.orthogonalize([x], **dict(opts, normalization="fp32"))[0])
        else:
            assert max_err(ours, theirs) <= medium_tol(theirs), (shape, opts)
    with pytest.raises(ValueError, match="needs precision 'medium'"):
        local_ns.orthogonalize(rand(4, 6, seed=0), precision="highest", normalization="bf16")


def test_the_server_refuses_bf16_normalization_without_medium(client):
    with pytest.raises(orthoserve.InvalidArgumentError, match="normalization bf16"):
        client.orthogonalize([rand(4, 6, seed=0)], precision="highest", normalization="bf16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_match_the_server(client, dtype):
    x = rand(24, 40, seed=7, dtype=dtype)
    ours = local_ns.orthogonalize(x, precision="highest")
    theirs = client.orthogonalize([x], precision="highest")[0]
    assert ours.dtype == dtype
    assert max_err(ours, theirs) <= theirs.abs().max().item() * 2 ** -7


def test_zero_matrix_gives_zeros():
    for eps in (1e-7, 0.0):
        for precision in ("highest", "medium"):
            out = local_ns.orthogonalize(torch.zeros(6, 4), eps=eps, precision=precision)
            assert torch.equal(out, torch.zeros(6, 4))


def test_bad_options_are_value_errors():
    x = rand(6, 4)
    for kw in [dict(steps=101), dict(coefficients="cubic5", steps=4), dict(coefficients="custom"),
               dict(split_qkv=[1, 1, 2]), dict(scale_mode="rms"), dict(coefficients="nope")]:
        with pytest.raises(ValueError):
            local_ns.orthogonalize(x, **kw)


# -- fallback ------------------------------------------------------------------------------------------------

def test_remote_newton_schulz_fallback_is_off_by_default():
    with orthoserve.Client(dead_address(), retry=NO_WAIT) as client:
        with pytest.raises(orthoserve.UnavailableError):
            RemoteNewtonSchulz(client)(rand(8, 12))


def test_remote_newton_schulz_falls_back_when_the_service_is_unreachable(caplog):
    x = rand(3, 8, 12, seed=4)
    with orthoserve.Client(dead_address(), retry=NO_WAIT) as client, caplog.at_level(logging.WARNING, "orthoserve"):
        ns = RemoteNewtonSchulz(client, fallback=True, steps=5)
        with oracle.matmul_precision("highest"), pytest.warns(RuntimeWarning, match="computing it locally"):
            out = ns(x)
        assert client.retries >= 1
    assert out.shape == x.shape
    with oracle.matmul_precision("highest"):
        from emerging_optimizers.orthogonalized_optimizers import muon_utils

        assert max_err(out, muon_utils.newton_schulz(x, steps=5)) <= TOL
    assert any("computing it locally" in r.getMessage() for r in caplog.records)


def test_fallback_does_not_hide_final_errors():
    fake = FakeServer()
    try:
        fake.servicer.fail(Failure(grpc.StatusCode.INVALID_ARGUMENT, "bad", method="stream"))
        with orthoserve.Client(fake.address, retry=NO_WAIT) as client:
            with pytest.raises(orthoserve.InvalidArgumentError):
                RemoteNewtonSchulz(client, fallback=True)(rand(4, 4))
    finally:
        fake.stop()


def test_muon_fallback(client):
    """Muon(fallback=True) on a dead address takes the same steps as Muon against the server (highest)."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(rand(12, 8, seed=1)), torch.nn.Parameter(rand(6, 2, 4, seed=2))]
    twins = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    grads = [rand(*w.shape, seed=10 + i) for i, w in enumerate(weights)]
    kw = dict(lr=0.02, fp32_matmul_prec="highest", nesterov=True)
    remote = Muon(twins, client=client, **kw)
    with orthoserve.Client(dead_address(), retry=NO_WAIT) as dead:
        probe = [torch.nn.Parameter(w.detach().clone()) for w in weights]
        for p, g in zip(probe, grads):
            p.grad = g.clone()
        with pytest.raises(orthoserve.UnavailableError):  # fallback is off by default
            Muon(probe, client=dead, **kw).step()
        local = Muon(weights, client=dead, fallback=True, **kw)
        for _ in range(2):
            for ws in (weights, twins):
                for w, g in zip(ws, grads):
                    w.grad = g.clone()
            with pytest.warns(RuntimeWarning):
                local.step()
            remote.step()
    for a, b in zip(weights, twins):
        assert max_err(a, b) <= TOL
