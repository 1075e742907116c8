"""Muon's per-parameter nd: "flatten" (the default: one shape[0] x prod(rest) matrix) or "batch" (stacked experts
(E, out, in) as E matrices), as a param group setting and as the parameter's `orthoserve_nd` attribute (which wins);
against a local per-matrix reference (Emerging-Optimizers' newton_schulz and scale factor, oracle.py)."""

import pytest
import torch

import oracle
import orthoserve
from fake_server import FakeServer
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve.torch import Muon

LR = 0.1


def param(shape, seed, nd=None):
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(shape, generator=g))
    p.grad = torch.randn(shape, generator=g)
    if nd is not None:
        p.orthoserve_nd = nd
    return p


def expected(p, nd):
    """p after one step of Muon(lr=LR, momentum=0, weight_decay=0, EO's defaults otherwise): p - LR * the scaled NS
    of its gradient, per matrix for "batch"."""
    g = p.grad
    if nd == "batch":
        orth = torch.stack([oracle.scaled(m, "spectral") for m in g.reshape(-1, *g.shape[-2:])]).reshape(g.shape)
    else:
        orth = oracle.scaled(g, "spectral")
    return p.detach() - LR * orth


KW = dict(lr=LR, momentum=0.0, weight_decay=0.0, fp32_matmul_prec="highest")


@pytest.mark.deadline(60)
def test_batch_attribute_and_group_setting_against_a_per_matrix_reference(client):
    experts = param((4, 6, 8), 0, nd="batch")  # The attribute: E = 4 matrices of 6 x 8.
    conv = param((4, 6, 8), 1)  # No attribute, group default "flatten": one 4 x 48 matrix.
    dense = param((6, 5), 2)
    grouped = param((3, 8, 4), 3)  # Its group says "batch".
    overridden = param((3, 8, 4), 4, nd="flatten")  # Its group says "batch", the attribute wins.
    want = [expected(experts, "batch"), expected(conv, "flatten"), expected(dense, "flatten"),
            expected(grouped, "batch"), expected(overridden, "flatten")]
    opt = Muon([dict(params=[experts, conv, dense]), dict(params=[grouped, overridden], nd="batch")], client=client,
               **KW)
    opt.step()
    for p, w in zip([experts, conv, dense, grouped, overridden], want):
        torch.testing.assert_close(p.detach(), w, atol=1e-5, rtol=0)
    # The batch is not the flattened matrix (the test would not tell them apart otherwise).
    assert (expected(grouped, "batch") - expected(grouped, "flatten")).abs().max() > 1e-2


@pytest.mark.deadline(60)
def test_batch_goes_as_nd_layout_batch_in_the_one_request_of_the_step():
    fake = FakeServer()
    try:
        with orthoserve.Client(fake.address) as client:
            a, b, c = param((2, 3, 4), 0, nd="batch"), param((2, 3, 4), 1), param((3, 4), 2, nd="batch")
            Muon([("a", a), ("b", b), ("c", c)], client=client, **KW).step()
        [messages] = fake.servicer.streams
        specs = [m.spec for m in messages if m.WhichOneof("kind") == "spec"]
        assert [(s.name, s.nd_layout) for s in specs] == [
            ("a", pb.ND_LAYOUT_BATCH), ("b", pb.ND_LAYOUT_UNSPECIFIED), ("c", pb.ND_LAYOUT_UNSPECIFIED)]
    finally:
        fake.stop()


class IdentityMuon(Muon):
    def orthogonalize_batch(self, params, updates):
        return [u.clone() for u in updates]


@pytest.mark.deadline(30)
@pytest.mark.parametrize("nd, ratio", [("batch", 2.0), ("flatten", 1.0)])
def test_adjust_lr_fn_takes_the_matrix_of_the_nd(nd, ratio):
    # torch.optim.Muon's "original": lr * sqrt(max(1, rows / cols)); a (4, 12, 3) batch is 12 x 3 matrices (ratio
    # 2), flattened it is 4 x 36 (ratio 1).
    p = param((4, 12, 3), 0, nd=nd)
    want = p.detach() - LR * ratio * p.grad
    IdentityMuon([p], lr=LR, momentum=0.0, weight_decay=0.0, adjust_lr_fn="original").step()
    torch.testing.assert_close(p.detach(), want, atol=1e-6, rtol=0)


@pytest.mark.deadline(30)
def test_a_bad_nd_is_refused_and_the_step_changes_nothing():
    with pytest.raises(ValueError, match="nd must be one of"):
        IdentityMuon([param((2, 3, 4), 0)], nd="stack")
    with pytest.raises(ValueError, match="nd must be one of"):
        IdentityMuon([dict(params=[param((2, 3, 4), 0)], nd="stack")])
    good, bad = param((2, 3, 4), 0), param((2, 3, 4), 1, nd="stack")
    opt = IdentityMuon([good, bad], lr=LR, momentum=0.5)
    before = [good.detach().clone(), bad.detach().clone()]
    with pytest.raises(ValueError, match="orthoserve_nd"):
        opt.step()
    assert torch.equal(good.detach(), before[0]) and torch.equal(bad.detach(), before[1]) and not opt.state
