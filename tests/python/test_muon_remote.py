"""The remote Muon against Emerging-Optimizers' Muon: the same small model, the same data, 5 steps, fp32
"highest"; one remote request per step; split_qkv as MindSpeed's TensorParallelMuon."""

import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

import oracle
from orthoserve.torch import Muon


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 32, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(32, 24, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(24, 4, bias=False))


def train(model, opt, steps=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 12, generator=g)
    y = torch.randn(64, 4, generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kw", [
    dict(),
    dict(nesterov=True, weight_decay_method="independent", weight_decay=0.05, coefficient_type="polar_express",
         scale_mode="shape_scaling", extra_scale_factor=0.5, num_ns_steps=7),
    dict(nesterov=True, weight_decay_method="l2", coefficient_type="cans", scale_mode="unit_rms_norm"),
], ids=["defaults", "nesterov-independent-polar", "l2-cans"])
def test_five_steps_match_emerging_optimizers(client, kw):
    kw = dict(lr=0.02, momentum=0.9, fp32_matmul_prec="highest", **kw)
    ours, theirs = make_model(), make_model()
    ours_losses = train(ours, Muon(ours.parameters(), client=client, **kw))
    theirs_losses = train(theirs, EOMuon(theirs.parameters(), **kw))
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert (a - b).abs().max().item() <= 1e-5
    assert ours_losses == pytest.approx(theirs_losses, rel=1e-5)


def test_one_batched_request_per_step(client):
    model = make_model()
    calls = []
    original = client.orthogonalize_batch

    def counting(matrices, options, **kw):
        calls.append(len(matrices))
        return original(matrices, options, **kw)

    client.orthogonalize_batch = counting
    try:
        train(model, Muon(model.parameters(), client=client, lr=0.02), steps=3)
    finally:
        del client.orthogonalize_batch
    assert calls == [3, 3, 3]


def test_split_qkv_orthogonalizes_q_k_v_separately(client):
    groups, q, k, v, cols = 2, 4, 2, 2, 12
    qkv = torch.nn.Parameter(torch.zeros(groups * (q + k + v), cols))
    other = torch.nn.Parameter(torch.zeros(6, cols))
    grad = torch.randn(qkv.shape, generator=torch.Generator().manual_seed(4))
    opt = Muon([qkv, other], client=client, lr=1.0, momentum=0.0, weight_decay=0.0, fp32_matmul_prec="highest",
               split_qkv=True, is_qkv_fn=lambda p: p is qkv, qkv_split_shapes=(q, k, v))
    qkv.grad, other.grad = grad.clone(), grad[:6].clone()
    opt.step()
    # MindSpeed's TensorParallelMuon.orthogonalize: view (groups, q+k+v, cols), split, orthogonalize and scale
    # each of Q, K, V as its own matrix, write back interleaved.
    parts = torch.split(grad.view(groups, q + k + v, cols), [q, k, v], dim=1)
    expected = torch.cat([oracle.scaled(p.reshape(-1, cols), "spectral").view(groups, -1, cols) for p in parts],
                         dim=1).view(grad.shape)
    assert (-qkv.detach() - expected).abs().max().item() <= 1e-5
    assert (-other.detach() - oracle.scaled(grad[:6], "spectral")).abs().max().item() <= 1e-5
