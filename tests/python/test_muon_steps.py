"""Muon's step logic (weight decay, EMA momentum, Nesterov, update) against Emerging-Optimizers' own
OrthogonalizedOptimizer and torch.optim.SGD, with the orthogonalization replaced by the identity (as EO's own
tests do) so that only the step order is compared. The remote orthogonalization is tested with a server in
test_muon_remote.py."""

import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers.orthogonalized_optimizer import OrthogonalizedOptimizer

from orthoserve.torch import Muon


class IdentityMuon(Muon):
    def orthogonalize_batch(self, params, updates):
        return [u.clone() for u in updates]


SHAPES_2D = [(6, 4), (3, 5)]
SHAPES = SHAPES_2D + [(4, 2, 3)]  # EO's base optimizer takes 2-D parameters only; ours also N-d.


def make_params(seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in shapes]


def run(opt_factory, steps=5, seed=0, shapes=SHAPES):
    params = [torch.nn.Parameter(p.clone()) for p in make_params(seed, shapes)]
    opt = opt_factory(params)
    g = torch.Generator().manual_seed(seed + 100)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("method", ["decoupled", "independent", "l2"])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_matches_emerging_optimizers_step(method, nesterov, momentum):
    kw = dict(lr=0.05, momentum=momentum, weight_decay=0.1, nesterov=nesterov, weight_decay_method=method,
              fp32_matmul_prec="highest")
    ours = run(lambda ps: IdentityMuon(ps, client=None, **kw), shapes=SHAPES_2D)
    theirs = run(lambda ps: OrthogonalizedOptimizer(ps, scaled_orthogonalize_fn=None, **kw), shapes=SHAPES_2D)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_identity_like_equals_sgd():
    ours = run(lambda ps: IdentityMuon(ps, client=None, lr=0.1, momentum=0.0, weight_decay=0.0))
    sgd = run(lambda ps: torch.optim.SGD(ps, lr=0.1))
    for a, b in zip(ours, sgd):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_ema_momentum_equals_sgd_momentum_with_scaled_lr(nesterov):
    # EMA buffer = (1 - beta) * SGD buffer, and EO's Nesterov (1-beta)g + beta*EMA = (1-beta)(g + beta*buf):
    # Muon(lr) with the identity is SGD(lr * (1 - beta), momentum=beta) with or without Nesterov.
    beta, lr = 0.9, 0.2
    ours = run(lambda ps: IdentityMuon(ps, client=None, lr=lr, momentum=beta, weight_decay=0.0, nesterov=nesterov))
    sgd = run(lambda ps: torch.optim.SGD(ps, lr=lr * (1 - beta), momentum=beta, nesterov=nesterov))
    for a, b in zip(ours, sgd):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_l2_weight_decay_equals_sgd_weight_decay():
    beta, lr, wd = 0.5, 0.1, 0.3
    ours = run(lambda ps: IdentityMuon(ps, client=None, lr=lr, momentum=beta, weight_decay=wd,
                                       weight_decay_method="l2"))
    sgd = run(lambda ps: torch.optim.SGD(ps, lr=lr * (1 - beta), momentum=beta, weight_decay=wd))
    for a, b in zip(ours, sgd):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_decoupled_and_independent_weight_decay_shrink_before_the_update():
    p0 = make_params()[0]
    for method, factor in [("decoupled", 1 - 0.5 * 0.2), ("independent", 1 - 0.2)]:
        p = torch.nn.Parameter(p0.clone())
        opt = IdentityMuon([p], client=None, lr=0.5, momentum=0.0, weight_decay=0.2, weight_decay_method=method)
        p.grad = torch.ones_like(p)
        opt.step()
        torch.testing.assert_close(p.detach(), p0 * factor - 0.5, rtol=1e-6, atol=1e-6)


def test_rejects_bad_arguments():
    p = [torch.nn.Parameter(torch.zeros(2, 2))]
    with pytest.raises(ValueError, match="weight_decay_method"):
        Muon(p, client=None, weight_decay_method="palm2")
    with pytest.raises(ValueError, match="fp32_matmul_prec"):
        Muon(p, client=None, fp32_matmul_prec="low")
    with pytest.raises(ValueError, match="num_ns_steps"):
        Muon(p, client=None, num_ns_steps=0)
    with pytest.raises(ValueError, match=">= 2 dims"):
        Muon([torch.nn.Parameter(torch.zeros(3))], client=None)
    with pytest.raises(ValueError, match="split_qkv needs"):
        Muon(p, client=None, split_qkv=True)
