"""A 4-rank torch.distributed (gloo) job trains a small model whose weights are DTensors — Shard(0) row blocks
(algorithm auto and row_sharded), a Shard(1) tensor-parallel layout (tp_duplicated), and a plain replicated
tensor sent whole — with the remote Muon against a 2-rank fleet (trainer ranks 0,1 -> fleet rank 0, 2,3 ->
fleet rank 1). After every step the full parameters equal the single-process computation with
Emerging-Optimizers' Muon (max abs difference <= 1e-5, fp32 "highest")."""

import json

import torch

from dist_util import run_ranks

STEPS = 3
KW = dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.01, fp32_matmul_prec="highest")
SHAPES = [(18, 12), (24, 18), (10, 24), (4, 10)]


def init_weights():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) / shape[1] ** 0.5 for shape in SHAPES]


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 12, generator=g), torch.randn(32, 4, generator=g)


def forward(weights, x):
    for w in weights[:-1]:
        x = torch.tanh(x @ w.T)
    return x @ weights[-1].T


def reference_run():
    """The single-process computation: plain tensors and Emerging-Optimizers' Muon."""
    from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

    weights = [torch.nn.Parameter(w) for w in init_weights()]
    opt = EOMuon(weights, **KW)
    x, y = batch()
    history = []
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(forward(weights, x), y).backward()
        opt.step()
        history.append([w.detach().clone() for w in weights])
    return history


def _train_rank(rank, world, fleet_address, out_path):
    import typing

    import typing_extensions

    typing.override = getattr(typing, "override", typing_extensions.override)  # EO on Python 3.11

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import orthoserve
    from orthoserve.torch import Muon

    mesh = init_device_mesh("cpu", (world,))
    init = init_weights()
    weights = [torch.nn.Parameter(distribute_tensor(init[0], mesh, [Shard(0)])),
               torch.nn.Parameter(distribute_tensor(init[1], mesh, [Shard(1)])),
               torch.nn.Parameter(distribute_tensor(init[2], mesh, [Shard(0)])),
               torch.nn.Parameter(init[3].clone())]
    weights[1].tp_mode = "duplicated"
    weights[2].orthoserve_algorithm = "row_sharded"
    x, y = batch()
    with orthoserve.Client(fleet_address, timeout=120) as client:
        opt = Muon(weights, client=client, job="test-distributed", **KW)
        history = []
        for _ in range(STEPS):
            opt.zero_grad()
            full = [w.full_tensor() if hasattr(w, "full_tensor") else w for w in weights]
            torch.nn.functional.mse_loss(forward(full, x), y).backward()
            opt.step()
            history.append([(w.full_tensor() if hasattr(w, "full_tensor") else w).detach().clone() for w in weights])
        fleet_rank = client.info(client.group("test-distributed", "x", rank, world, run_id=opt.run_id).address).fleet_rank
    if rank == 0:
        ref = reference_run()
        errors = [[(a - b).abs().max().item() for a, b in zip(step_ours, step_ref)]
                  for step_ours, step_ref in zip(history, ref)]
    else:
        errors = None
    torch.distributed.barrier()
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, fleet_rank)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"errors": errors, "fleet_ranks": gathered}, f)


def test_dtensor_muon_on_four_ranks_matches_single_process(fleet2, tmp_path):
    out = tmp_path / "result.json"
    run_ranks(4, _train_rank, fleet2[0].address, str(out), timeout=300)
    result = json.loads(out.read_text())
    assert result["fleet_ranks"] == [0, 0, 1, 1]
    for step, errs in enumerate(result["errors"]):
        assert max(errs) <= 1e-5, (step, errs)
    # The parameters moved (the comparison is not between two unchanged models).
    ref = reference_run()
    assert (ref[-1][0] - init_weights()[0]).abs().max().item() > 1e-3
