"""orthoserve.torch.Muon takes torch.optim.Muon's arguments as well as Emerging-Optimizers' (test_muon_remote.py),
per parameter group, so that either optimizer can be swapped for it in a training script.

Numerics: torch.optim.Muon always runs its Newton–Schulz in bf16. To compare the optimizers' step logic exactly,
torch's NS is replaced (in torch.optim._muon, for the test) by the same iteration in fp32 — EO's newton_schulz with
the one (a, b, c) triple, eps in max mode, "highest" — and ours runs with fp32_matmul_prec="highest": parameters
agree within 1e-5 (max abs) after 5 steps. Unmodified torch.optim.Muon (bf16) against ours in "medium", whose torch
flavor sends normalization "bf16" (torch's order: the update rounded to bf16 before it is normalized in bf16): the
parameter changes agree within 2e-2 relative (Frobenius) after 5 steps — what is left is the fp32 accumulation order
inside the bf16 products, which moves a bf16 rounding now and then; measured 0 to 1.6e-2 over 8 seeds (seeds 6 and 7
bit for bit; with fp32 normalization it was 0.7e-2 to 3.7e-2). A wrong default (EO's quintic coefficients, a scale
factor, no lr adjustment) would be off by 10% to several times."""

import copy
import inspect

import pytest
import torch
import torch.optim._muon as torch_muon
from emerging_optimizers.orthogonalized_optimizers import muon_utils
from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

import oracle
import orthoserve
import orthoserve.torch as ot
from orthoserve.torch import Muon

FP32_TOL = 1e-5
BF16_REL_TOL = 2e-2
SHAPES = [(32, 12), (24, 32), (8, 24)]  # Tall, wide and wide: every adjust_lr_fn branch differs.


def make_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g) / shape[1] ** 0.5) for shape in SHAPES]


def forward(params, x):
    w0, w1, w2 = params
    return torch.tanh(torch.tanh(x @ w0.T) @ w1.T) @ w2.T  # 12 -> 32 -> 24 -> 8


def train(params, opt, steps=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(64, 12, generator=g), torch.randn(64, 8, generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(params, x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def max_diff(a_params, b_params):
    return max((a - b).abs().max().item() for a, b in zip(a_params, b_params))


@pytest.fixture()
def torch_ns_in_fp32(monkeypatch):
    """torch.optim.Muon's Newton–Schulz in fp32 (its own checks kept)."""
    def fp32(grad, ns_coefficients, ns_steps, eps):
        if ns_steps >= 100:
            raise ValueError("Number of steps must be less than 100 for computational efficiency")
        if len(ns_coefficients) != 3:
            raise ValueError("Coefficients must be a tuple of exactly 3 values")
        with oracle.matmul_precision("highest"):
            return muon_utils.newton_schulz(grad, steps=ns_steps, coefficient_type="custom",
                                            custom_coefficient_sets=[tuple(ns_coefficients)], eps=eps)

    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", fp32)


@pytest.mark.parametrize("kw", [
    dict(lr=0.02),
    dict(lr=0.02, weight_decay=0.05, momentum=0.9, nesterov=False, ns_steps=3, ns_coefficients=(3.0, -3.2, 1.2),
         eps=1e-3, adjust_lr_fn="match_rms_adamw"),
    dict(lr=0.01, adjust_lr_fn="spectral_unclamped", weight_decay=0.0),
    dict(lr=0.03, adjust_lr_fn="original", ns_steps=7),
], ids=["defaults", "everything", "spectral_unclamped", "original"])
def test_torch_arguments_match_torch_optim_muon(client, torch_ns_in_fp32, kw):
    ours, theirs = make_params(), make_params()
    ours_losses = train(ours, Muon(ours, client=client, flavor="torch", fp32_matmul_prec="highest", **kw))
    theirs_losses = train(theirs, torch.optim.Muon(theirs, **kw))
    assert max_diff(ours, theirs) <= FP32_TOL
    assert ours_losses == pytest.approx(theirs_losses, rel=1e-5)
    assert max_diff(theirs, make_params()) > 1e-3  # The parameters moved.


def test_per_group_settings_match_torch_optim_muon(client, torch_ns_in_fp32):
    def groups(params):
        return [dict(params=[params[0]], ns_steps=3, ns_coefficients=(3.0, -3.2, 1.2), nesterov=False,
                     adjust_lr_fn="match_rms_adamw", eps=1e-4, lr=0.05, weight_decay=0.0),
                dict(params=[params[1]], momentum=0.8, adjust_lr_fn="spectral_unclamped"),
                dict(params=[params[2]])]

    ours, theirs = make_params(), make_params()
    opt = Muon(groups(ours), client=client, lr=0.02, weight_decay=0.01, flavor="torch", fp32_matmul_prec="highest")
    train(ours, opt)
    train(theirs, torch.optim.Muon(groups(theirs), lr=0.02, weight_decay=0.01))
    assert max_diff(ours, theirs) <= FP32_TOL
    # Each group's settings took effect: the first group's differ from the defaults.
    assert opt.param_groups[0]["ns_steps"] == 3 and opt.param_groups[0]["coefficient_type"] == "custom"
    assert opt.param_groups[2]["ns_coefficients"] == (3.4445, -4.7750, 2.0315)


def test_unmodified_torch_optim_muon_in_bf16_tracks_ours_in_medium(client):
    start = make_params()
    ours, theirs = make_params(), make_params()
    train(ours, Muon(ours, client=client, lr=0.02, flavor="torch"))
    train(theirs, torch.optim.Muon(theirs, lr=0.02))
    for a, b, p0 in zip(ours, theirs, start):
        moved = (b - p0).detach()
        assert ((a - b).norm() / moved.norm()).item() <= BF16_REL_TOL


def script(optimizer_class, params, **kw):
    """A training script's optimizer line: only the class differs between the runs."""
    return train(params, optimizer_class(params, lr=0.02, momentum=0.95, weight_decay=0.01, **kw))


def test_swapped_into_a_torch_script(client, torch_ns_in_fp32):
    ot.set_default_client(client)  # Or ORTHOSERVE_ADDRESS: the script passes no client.
    try:
        ours, theirs = make_params(), make_params()
        losses = script(Muon, ours, nesterov=True, ns_steps=5, adjust_lr_fn="original")
        script(torch.optim.Muon, theirs, nesterov=True, ns_steps=5, adjust_lr_fn="original")
    finally:
        ot.set_default_client(None)
    # ns_steps and adjust_lr_fn made it torch's flavor; its precision is "medium" (torch's NS is bf16), so this
    # run is within bf16 of the fp32 reference, and it trains.
    assert max_diff(ours, theirs) <= 2e-3
    assert losses[-1] < losses[0]


def test_swapped_into_an_emerging_optimizers_script(client):
    ot.set_default_client(client)
    try:
        kw = dict(nesterov=True, weight_decay_method="independent", fp32_matmul_prec="highest",
                  coefficient_type="polar_express", num_ns_steps=6, scale_mode="unit_rms_norm",
                  extra_scale_factor=0.5, use_syrk=True)
        ours, theirs = make_params(), make_params()
        script(Muon, ours, **kw)
        script(EOMuon, theirs, **kw)  # EO turns use_syrk off without a GPU; ours accepts it, same numbers.
    finally:
        ot.set_default_client(None)
    assert max_diff(ours, theirs) <= FP32_TOL


def test_per_group_emerging_optimizers_settings(client):
    settings = [dict(coefficient_type="polar_express", num_ns_steps=7, scale_mode="shape_scaling", lr=0.05),
                dict(coefficient_type="cans", nesterov=True, weight_decay_method="l2", extra_scale_factor=0.2),
                dict()]
    common = dict(lr=0.02, momentum=0.9, weight_decay=0.01, fp32_matmul_prec="highest")
    ours, theirs = make_params(), make_params()
    opt = Muon([dict(params=[p], **s) for p, s in zip(ours, settings)], client=client, **common)
    # EO has one NS setting per optimizer: one EO optimizer per group.
    eo = [EOMuon([p], **{**common, **s}) for p, s in zip(theirs, settings)]

    class Both:
        def zero_grad(self):
            for o in eo:
                o.zero_grad()

        def step(self):
            for o in eo:
                o.step()

    train(ours, opt)
    train(theirs, Both())
    assert max_diff(ours, theirs) <= FP32_TOL


def test_accepts_every_argument_of_both():
    ours = inspect.signature(Muon.__init__).parameters
    for other in (torch.optim.Muon, EOMuon):
        missing = [n for n in inspect.signature(other.__init__).parameters if n != "self" and n not in ours]
        assert not missing, (other, missing)


def params2():
    return [torch.nn.Parameter(torch.zeros(4, 6))]


def test_flavor_decides_the_defaults():
    eo = Muon(params2())
    assert eo.flavor == "eo"
    assert {k: eo.defaults[k] for k in ("lr", "momentum", "weight_decay", "nesterov", "coefficient_type",
                                        "ns_steps", "scale_mode", "fp32_matmul_prec", "adjust_lr_fn")} == dict(
        lr=3e-4, momentum=0.95, weight_decay=0.01, nesterov=False, coefficient_type="quintic", ns_steps=5,
        scale_mode="spectral", fp32_matmul_prec="medium", adjust_lr_fn="none")
    for kw in (dict(ns_steps=5), dict(adjust_lr_fn=None), dict(ns_coefficients=(3.4445, -4.7750, 2.0315))):
        t = Muon(params2(), **kw)
        assert t.flavor == "torch", kw
        assert {k: t.defaults[k] for k in ("lr", "weight_decay", "nesterov", "coefficient_type", "ns_coefficients",
                                           "eps", "scale_mode", "adjust_lr_fn")} == dict(
            lr=1e-3, weight_decay=0.1, nesterov=True, coefficient_type="custom",
            ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, scale_mode="none", adjust_lr_fn=None)
    assert Muon(params2(), flavor="torch").defaults["lr"] == 1e-3
    assert Muon(params2(), num_ns_steps=3, flavor="torch").defaults["ns_steps"] == 3


def test_argument_errors():
    with pytest.raises(TypeError, match="flavor="):
        Muon(params2(), ns_steps=3, scale_mode="spectral")  # torch's and EO's own arguments mixed
    Muon(params2(), ns_steps=3, scale_mode="spectral", flavor="eo")
    with pytest.raises(TypeError, match="not both"):
        Muon(params2(), ns_steps=3, num_ns_steps=3, flavor="torch")
    with pytest.raises(TypeError):
        Muon(params2(), bogus=1)
    with pytest.raises(TypeError):
        torch.optim.Muon(params2(), bogus=1)
    with pytest.raises(TypeError, match="client by keyword"):
        Muon(params2(), orthoserve.Client("127.0.0.1:1"))
    with pytest.raises(ValueError, match="flavor"):
        Muon(params2(), flavor="keras")
    with pytest.raises(ValueError, match="exactly 3 values"):
        Muon(params2(), ns_coefficients=(1.0, 2.0))
    with pytest.raises(ValueError, match="ns_steps"):
        Muon(params2(), ns_steps=0)
    with pytest.raises(ValueError, match="at most 100"):
        Muon(params2(), ns_steps=101)
    with pytest.raises(ValueError, match="coefficient_type"):
        Muon(params2(), coefficient_type="quartic")
    with pytest.raises(ValueError, match="needs ns_coefficients"):
        Muon(params2(), coefficient_type="custom")
    with pytest.raises(ValueError, match="eps"):
        Muon(params2(), eps=-1.0)
    opt = Muon(params2(), flavor="torch")
    with pytest.raises(ValueError, match="Adjust learning rate function"):
        opt.add_param_group(dict(params=params2(), adjust_lr_fn="cosine"))
    with pytest.raises(ValueError, match=">= 2 dims"):
        opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(3))]))


@pytest.mark.parametrize("kw", [dict(lr=-1.0), dict(momentum=-0.5), dict(weight_decay=-0.1),
                                dict(adjust_lr_fn="bogus")])
def test_value_errors_say_what_torch_says(kw):
    with pytest.raises(ValueError) as theirs:
        torch.optim.Muon(params2(), **kw)
    with pytest.raises(ValueError) as ours:
        Muon(params2(), **kw)
    assert str(ours.value) == str(theirs.value)


def test_loads_a_torch_optim_muon_state_dict(client, torch_ns_in_fp32):
    # Two steps with torch, then the state (momentum buffers, groups) moves to ours, which takes three more.
    ours, theirs = make_params(), make_params()
    reference = torch.optim.Muon(theirs, lr=0.02)
    train(theirs, reference, steps=2)
    with torch.no_grad():
        for a, b in zip(ours, theirs):
            a.copy_(b)
    opt = Muon(ours, client=client, lr=0.02, flavor="torch", fp32_matmul_prec="highest")
    opt.load_state_dict(copy.deepcopy(reference.state_dict()))  # As from a file (state_dict() shares the tensors).
    train(ours, opt, steps=3, seed=5)
    train(theirs, reference, steps=3, seed=5)
    assert max_diff(ours, theirs) <= FP32_TOL
