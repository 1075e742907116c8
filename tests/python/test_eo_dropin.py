"""orthoserve.torch.newton_schulz is Emerging-Optimizers 0.3.0's newton_schulz run by the service: the same
signature, the same exceptions (types and messages), 3-D input as a batch (one matrix on the wire, nd_layout
BATCH), the precision of torch.get_float32_matmul_precision(), eps in max mode, transpose None/True/False, no scale,
use_syrk accepted, and the results of EO's function within the tolerances below (EO, installed in the venv, is the
oracle). The tp_group (tensor-parallel) form is in test_eo_tp.py. Replacing EO's function by ours the way
scripts/peer_tests.sh's plugin does is checked at the end.

Tolerances: HIGHEST, max abs difference <= 1e-5 (both fp32; docs/numerics.md §4 holds the engine to 1e-5 relative).
MEDIUM: relative Frobenius difference <= 3e-2 (both round X, A and B to bf16 after each product, with fp32
accumulation in different orders, so a bf16 rounding moves now and then and later steps amplify it; measured up to
1.9e-2, aol at 256 x 128, over 5 seeds, 4 shapes and the 6 coefficient sets; docs/numerics.md §4)."""

import importlib.util
import inspect

import numpy as np
import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers import muon_utils, spectral_clipping_utils
from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

import orthoserve
import orthoserve.torch as ot
import oracle
from conftest import REPO
from fake_server import FakeServer
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

HIGHEST_TOL = 1e-5
MEDIUM_REL_TOL = 3e-2
EO_TYPES = ["simple", "quintic", "polar_express", "cans", "aol", "deepseekv4"]


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def max_err(a, b):
    return (a - b).abs().max().item()


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture()
def default_client(client):
    """newton_schulz's default client is the session server's client for the test, and nothing after it."""
    ot.set_default_client(client)
    yield client
    ot.set_default_client(None)


@pytest.fixture()
def no_server(monkeypatch):
    """No default client and no ORTHOSERVE_ADDRESS: a call that reached for the service would fail."""
    ot.set_default_client(None)
    monkeypatch.delenv(ot.ENV_ADDRESS, raising=False)


def ours_and_eo(x, precision="highest", **kw):
    with oracle.matmul_precision(precision):
        return ot.newton_schulz(x, **kw), muon_utils.newton_schulz(x, **kw)


def test_signature_is_emerging_optimizers():
    theirs = inspect.signature(muon_utils.newton_schulz).parameters
    ours = inspect.signature(ot.newton_schulz).parameters
    assert list(ours) == list(theirs)
    for name, p in theirs.items():
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name


@pytest.mark.parametrize("shape", [(48, 32), (32, 48), (40, 40), (3, 24, 40), (2, 40, 24), (1, 16, 16)])
@pytest.mark.parametrize("coefficient_type", EO_TYPES)
def test_matches_emerging_optimizers_in_highest(default_client, shape, coefficient_type):
    x = rand(*shape, seed=sum(shape))
    ours, theirs = ours_and_eo(x, steps=5, coefficient_type=coefficient_type)
    assert ours.shape == x.shape and ours.dtype == torch.float32 and ours.device == x.device
    assert max_err(ours, theirs) <= HIGHEST_TOL


@pytest.mark.parametrize("steps", [0, 1, 9, 12])
@pytest.mark.parametrize("coefficient_type", ["polar_express", "cans", "deepseekv4", "quintic"])
def test_steps_past_the_list_repeat_or_cycle_as_emerging_optimizers(default_client, steps, coefficient_type):
    x = rand(24, 36, seed=steps)
    ours, theirs = ours_and_eo(x, steps=steps, coefficient_type=coefficient_type)
    assert max_err(ours, theirs) <= HIGHEST_TOL


@pytest.mark.parametrize("shape", [(20, 30), (2, 30, 20)])
def test_custom_coefficient_sets_cycle(default_client, shape):
    x = rand(*shape, seed=3)
    ours, theirs = ours_and_eo(x, steps=7, coefficient_type="custom", custom_coefficient_sets=oracle.CUSTOM)
    assert max_err(ours, theirs) <= HIGHEST_TOL
    # Sets given with a named type are ignored, as EO ignores them.
    ours, theirs = ours_and_eo(x, steps=3, coefficient_type="quintic", custom_coefficient_sets=oracle.CUSTOM)
    assert max_err(ours, theirs) <= HIGHEST_TOL


@pytest.mark.parametrize("transpose", [None, True, False])
@pytest.mark.parametrize("shape", [(40, 24), (24, 40), (3, 40, 24)])
def test_transpose_none_true_false(default_client, shape, transpose):
    x = rand(*shape, seed=11)
    ours, theirs = ours_and_eo(x, steps=5, transpose=transpose)
    assert max_err(ours, theirs) <= HIGHEST_TOL  # (Both orientations give the same polynomial; the wire test
    # below checks that the orientation asked for is the one sent.)


@pytest.mark.parametrize("eps, scale", [(1e-7, 1e-9), (1e-7, 1.0), (1e-3, 1e-5), (0.0, 1e-3)])
def test_eps_is_max_mode(default_client, eps, scale):
    x = rand(16, 24, seed=5) * scale
    ours, theirs = ours_and_eo(x, steps=5, eps=eps)
    assert max_err(ours, theirs) <= HIGHEST_TOL
    zeros = torch.zeros(4, 6)
    ours, theirs = ours_and_eo(zeros, steps=5, eps=eps if eps else 1e-7)
    assert torch.equal(ours, theirs) and not ours.any()


@pytest.mark.parametrize("shape", [(64, 48), (48, 64), (4, 32, 48)])
@pytest.mark.parametrize("coefficient_type", ["quintic", "polar_express", "aol"])
def test_medium_tracks_emerging_optimizers(default_client, shape, coefficient_type):
    x = rand(*shape, seed=7)
    ours, theirs = ours_and_eo(x, precision="medium", steps=5, coefficient_type=coefficient_type)
    assert rel_err(ours, theirs) <= MEDIUM_REL_TOL
    # MEDIUM is really bf16: farther from fp32 than from EO's bf16 computation.
    fp32, _ = ours_and_eo(x, precision="highest", steps=5, coefficient_type=coefficient_type)
    assert rel_err(ours, fp32) > 1e-3


def test_3d_is_a_batch_of_independent_matrices(default_client):
    x = rand(4, 24, 40, seed=2)
    with oracle.matmul_precision("highest"):
        batched = ot.newton_schulz(x, steps=5)
        singles = torch.stack([ot.newton_schulz(x[i], steps=5) for i in range(4)])
        flat = default_client.orthogonalize([x], precision="highest", scale_mode="none")[0]
    assert torch.equal(batched, singles)
    assert max_err(flat, batched) > 1e-2  # The flattened view (the service's default) is another computation.


def test_use_syrk_gives_the_same_numbers(default_client):
    x = rand(32, 48, seed=4)
    with oracle.matmul_precision("medium"):
        plain = ot.newton_schulz(x, steps=5)
        syrk = ot.newton_schulz(x, steps=5, use_syrk=True)
    assert torch.equal(plain, syrk)
    # Outside "medium" EO checks nothing about use_syrk: 3-D input is fine.
    y = rand(2, 8, 12, seed=5)
    ours, theirs = ours_and_eo(y, steps=5, use_syrk=True)
    assert max_err(ours, theirs) <= HIGHEST_TOL


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 3, 4), (2, 0, 4)])
def test_empty_input_gives_an_empty_result_as_emerging_optimizers(no_server, shape):
    x = torch.empty(shape)
    ours, theirs = ours_and_eo(x, steps=5)
    assert ours.shape == theirs.shape == x.shape and ours.dtype == torch.float32


CASES = {
    "1-D": (lambda: torch.randn(10), {}, "highest"),
    "4-D": (lambda: torch.randn(2, 3, 4, 5), {}, "highest"),
    "float64": (lambda: torch.randn(5, 7, dtype=torch.float64), {}, "highest"),
    "bfloat16": (lambda: torch.randn(5, 7, dtype=torch.bfloat16), {}, "highest"),
    "custom without sets": (lambda: torch.randn(5, 7), dict(coefficient_type="custom"), "highest"),
    "custom with no sets": (lambda: torch.randn(5, 7), dict(coefficient_type="custom", custom_coefficient_sets=[]),
                            "highest"),
    "unknown type": (lambda: torch.randn(5, 7), dict(coefficient_type="nonexistent"), "highest"),
    "cubic5 (orthoserve's, not EO's)": (lambda: torch.randn(5, 7), dict(coefficient_type="cubic5"), "highest"),
    "use_syrk with 3-D in medium": (lambda: torch.randn(2, 4, 8), dict(use_syrk=True), "medium"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exceptions_are_emerging_optimizers(no_server, case):
    make, kw, precision = CASES[case]
    x = make()
    with oracle.matmul_precision(precision):
        with pytest.raises(Exception) as theirs:
            muon_utils.newton_schulz(x, steps=5, **kw)
        with pytest.raises(Exception) as ours:
            ot.newton_schulz(x, steps=5, **kw)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_negative_steps_raise_value_error_as_emerging_optimizers(no_server):
    x = torch.randn(4, 6)
    with pytest.raises(ValueError):
        muon_utils.newton_schulz(x, steps=-1)
    with pytest.raises(ValueError):
        ot.newton_schulz(x, steps=-1)


# -- on the wire --------------------------------------------------------------------------------------------

@pytest.fixture()
def fake():
    server = FakeServer()
    ot.set_default_client(orthoserve.Client(server.address))
    yield server
    ot.set_default_client(None)
    server.stop()


def sent_specs(fake):
    return [m.spec for m in fake.servicer.streams[-1] if m.WhichOneof("kind") == "spec"]


@pytest.mark.parametrize("precision, wire", [("highest", pb.PRECISION_HIGHEST), ("high", pb.PRECISION_HIGH),
                                             ("medium", pb.PRECISION_MEDIUM)])
def test_precision_follows_torch(fake, precision, wire):
    with oracle.matmul_precision(precision):
        ot.newton_schulz(torch.ones(3, 4), steps=5)
    [spec] = sent_specs(fake)
    assert spec.options.precision == wire


@pytest.mark.parametrize("transpose, wire", [(None, pb.TRANSPOSE_AUTO), (True, pb.TRANSPOSE_ON),
                                             (False, pb.TRANSPOSE_OFF)])
def test_request_options(fake, transpose, wire):
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    out = ot.newton_schulz(x, steps=7, coefficient_type="custom", custom_coefficient_sets=[(1, 2, 3), (4, 5, 6)],
                           eps=1e-5, transpose=transpose)
    assert torch.equal(out, x)  # The fake server echoes the bytes.
    [spec] = sent_specs(fake)
    o = spec.options
    assert o.transpose == wire
    assert o.coefficients == pb.COEFFICIENTS_CUSTOM and o.steps == 7 and o.eps == 1e-5
    assert [(t.a, t.b, t.c) for t in o.custom_coefficients] == [(1, 2, 3), (4, 5, 6)]
    assert o.eps_mode == pb.EPS_MODE_MAX and o.scale_mode == pb.SCALE_MODE_NONE
    assert spec.nd_layout in (pb.ND_LAYOUT_UNSPECIFIED, pb.ND_LAYOUT_FLATTEN)


def test_3d_goes_as_one_batch_matrix(fake):
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    assert torch.equal(ot.newton_schulz(x, steps=5), x)
    [spec] = sent_specs(fake)
    assert list(spec.shape) == [2, 3, 4] and spec.nd_layout == pb.ND_LAYOUT_BATCH


# -- which server --------------------------------------------------------------------------------------------

def test_without_a_server_the_error_says_how_to_set_one(no_server):
    with pytest.raises(RuntimeError, match="set_default_client.*ORTHOSERVE_ADDRESS"):
        ot.newton_schulz(torch.randn(4, 6), steps=5)
    with pytest.raises(TypeError):
        ot.set_default_client(42)


def test_the_environment_names_the_server(server, no_server, monkeypatch):
    fake = FakeServer()
    try:
        x = rand(6, 10)
        monkeypatch.setenv(ot.ENV_ADDRESS, f"{fake.address}")
        assert torch.equal(ot.newton_schulz(x, steps=5), x)  # The (echoing) fake server answered.
        monkeypatch.setenv(ot.ENV_ADDRESS, f" {server.address} ,{fake.address}")
        with oracle.matmul_precision("highest"):
            out = ot.newton_schulz(x, steps=5)
            assert max_err(out, muon_utils.newton_schulz(x, steps=5)) <= HIGHEST_TOL
        assert ot.get_default_client().addresses == [server.address, fake.address]
        # An explicit default client wins over the environment; an address string is made into a client.
        ot.set_default_client(fake.address)
        assert torch.equal(ot.newton_schulz(x, steps=5), x)
    finally:
        ot.set_default_client(None)
        fake.stop()


# -- replacing Emerging-Optimizers' function (what scripts/peer_tests.sh's plugin does) ----------------------

def load_plugin():
    spec = importlib.util.spec_from_file_location("eo_plugin", REPO / "client" / "python" / "tools" / "eo_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 32, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(32, 24, bias=False))


def train(model, steps=4):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 12, generator=g), torch.randn(64, 24, generator=g)
    opt = EOMuon(model.parameters(), lr=0.02, momentum=0.9, nesterov=True, fp32_matmul_prec="highest")
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def test_the_plugin_routes_every_emerging_optimizers_caller_through_orthoserve(default_client, monkeypatch):
    original = muon_utils.newton_schulz
    reference = make_model()
    train(reference)
    x = rand(48, 32, seed=9)
    with oracle.matmul_precision("highest"):
        clip_ref = spectral_clipping_utils.spectral_hardcap(x, beta=0.5)
        tp_ref = muon_utils.newton_schulz_tp(x, steps=5, coefficient_type="quintic", tp_group=None)
    calls = []
    remote = ot.newton_schulz

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return remote(*args, **kwargs)

    monkeypatch.setattr(ot, "newton_schulz", counting)  # What the plugin installs, counted.
    monkeypatch.setattr(muon_utils, "newton_schulz", original)  # Restored after the test by monkeypatch.
    monkeypatch.setattr(spectral_clipping_utils, "newton_schulz", spectral_clipping_utils.newton_schulz)
    load_plugin().pytest_configure(None)
    assert muon_utils.newton_schulz is counting and spectral_clipping_utils.newton_schulz is counting

    ours = make_model()
    train(ours)  # EO's Muon optimizer, unchanged, now orthogonalizes remotely.
    assert len(calls) == 4 * 2
    for a, b in zip(ours.parameters(), reference.parameters()):
        assert max_err(a.detach(), b.detach()) <= HIGHEST_TOL
    with oracle.matmul_precision("highest"):
        clip = spectral_clipping_utils.spectral_hardcap(x, beta=0.5)
        tp = muon_utils.newton_schulz_tp(x, steps=5, coefficient_type="quintic", tp_group=None)
    assert len(calls) == 8 + 2 + 1
    assert max_err(clip, clip_ref) <= 1e-4 and max_err(tp, tp_ref) <= HIGHEST_TOL


def test_remote_newton_schulz_still_takes_orthoserve_options(default_client):
    x = rand(3, 16, 24, seed=1)
    ns = ot.RemoteNewtonSchulz(coefficients="polar_express", steps=6)  # No client: the default one.
    with oracle.matmul_precision("highest"):
        assert max_err(ns(x), muon_utils.newton_schulz(x, steps=6, coefficient_type="polar_express")) <= HIGHEST_TOL
    half = ns(x.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == x.shape
    assert isinstance(default_client.orthogonalize(np.ones((4, 5), np.float32)), np.ndarray)
