"""orthoserve.torch.eo.Muon against Emerging-Optimizers 0.3.0's Muon run here, as a user swapping the import would
compare them: the signature (names, defaults, kinds, positional order) and the numbers, in "highest" (both fp32, so
they agree to fp32 accumulation order: 1e-5 max abs after 5 steps, as test_muon_flavors.py holds the shared class)
and in EO's default "medium" (bf16 products: within 2e-2 of the parameter change)."""

import inspect

import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers import Muon as EOMuon

from orthoserve.torch.eo import Muon

FP32_TOL = 1e-5
BF16_REL_TOL = 2e-2


def signature(cls):
    return [(p.name, p.default, p.kind) for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self"]


def test_signature_is_emerging_optimizers_muons():
    ours, theirs = signature(Muon), signature(EOMuon)
    assert ours[:len(theirs)] == theirs
    assert all(kind == inspect.Parameter.KEYWORD_ONLY for _, _, kind in ours[len(theirs):])


def train(params, opt, steps=5):
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def make(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g) * 0.1) for shape in ((32, 12), (24, 32), (16, 16))]


@pytest.mark.parametrize("kw", [
    dict(),
    dict(nesterov=True, weight_decay_method="palm", coefficient_type="polar_express", num_ns_steps=6,
         scale_mode="unit_rms_norm", extra_scale_factor=0.5),
    dict(weight_decay_method="l2", scale_mode="shape_scaling"),
], ids=["defaults", "palm,polar_express", "l2"])
def test_the_same_numbers_as_emerging_optimizers(client, kw):
    for prec, tol in (("highest", FP32_TOL), ("medium", BF16_REL_TOL)):
        start, ours, theirs = make(), make(), make()
        train(ours, Muon(ours, 0.02, 0.9, 0.1, fp32_matmul_prec=prec, client=client, **kw))
        train(theirs, EOMuon(theirs, 0.02, 0.9, 0.1, fp32_matmul_prec=prec, **kw))
        for a, b, s in zip(ours, theirs, start):
            if prec == "highest":
                assert (a - b).abs().max().item() <= tol, kw
            else:
                assert ((a - b).norm() / (b - s).norm()).item() <= tol, kw


def test_flavor_is_eos_and_fp32_normalization():
    p = torch.nn.Parameter(torch.zeros(4, 6))
    opt = Muon([p])
    assert opt.flavor == "eo"
    opts = opt._options_for(p)
    assert opts["normalization"] == "fp32" and opts["coefficients"] == "quintic" and opts["scale_mode"] == "spectral"
