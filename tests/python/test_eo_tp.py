"""orthoserve.torch.newton_schulz(..., tp_group=G) on 4 torch.distributed (gloo) ranks: every rank of G holds a block
of one matrix and the ranks make one TP_DISTRIBUTED group step, as Emerging-Optimizers' distributed newton_schulz
(normalization over the whole matrix, Gram summed over the ranks). Compared with EO's own distributed function run
on the same blocks and with EO on the whole matrix (max abs difference <= 1e-5, fp32 "highest"; MEDIUM: relative
Frobenius difference <= 3e-2, as test_eo_dropin.py): split along columns (transpose False, or None with wide blocks)
and rows (transpose True), uneven blocks, sub-groups of 2 and of 1, EO's newton_schulz_tp calling ours, a group
key that all ranks of a group share and other groups do not, one step number per call, and the errors."""

import torch

from dist_util import run_ranks

HIGHEST_TOL = 1e-5
MEDIUM_REL_TOL = 3e-2


def _same_on_all_ranks(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-5, 5, shape, generator=g).float()


def _check(ours, theirs, tol=HIGHEST_TOL, what=""):
    err = (ours - theirs).abs().max().item()
    assert ours.shape == theirs.shape and err <= tol, (what, err)


def _tp_rank(rank, world, address):
    import typing

    import typing_extensions

    typing.override = getattr(typing, "override", typing_extensions.override)  # EO on Python 3.11
    import pytest
    import torch.distributed as dist
    from emerging_optimizers.orthogonalized_optimizers import muon_utils

    import orthoserve
    import orthoserve.torch as ot
    from orthoserve.torch import tp_groups

    ot.set_default_client(orthoserve.Client(address, timeout=120))
    torch.set_float32_matmul_precision("highest")
    everyone = dist.group.WORLD
    eo_newton_schulz = muon_utils.newton_schulz

    # (shape, transpose, the dim the blocks split): EO's pairing — the dim the Gram contracts.
    cases = [((5, 100), None, 1), ((3, 32), None, 1), ((5, 100), False, 1), ((32, 3), True, 0), ((40, 24), True, 0),
             ((6, 30), None, 1)]  # The last: blocks of 8, 8, 8 and 6 columns.
    for seed, (shape, transpose, dim) in enumerate(cases):
        x = _same_on_all_ranks(shape, seed)
        local = x.chunk(world, dim=dim)[rank]
        for steps, coefficient_type in [(1, "simple"), (5, "quintic")]:
            ours = ot.newton_schulz(local, steps, coefficient_type, transpose=transpose, tp_group=everyone)
            theirs = eo_newton_schulz(local, steps, coefficient_type, transpose=transpose, tp_group=everyone)
            whole = eo_newton_schulz(x, steps, coefficient_type, transpose=transpose).chunk(world, dim=dim)[rank]
            _check(ours, theirs, what=(shape, transpose, steps))
            _check(ours, whole, what=(shape, transpose, steps, "whole"))
    state = tp_groups._tp_groups[everyone]
    assert state.calls == 2 * len(cases)
    names = [None] * world
    dist.all_gather_object(names, state.name)
    assert len(set(names)) == 1 and names[0].startswith("newton_schulz/tp4/")

    # MEDIUM (bf16 products; EO sums bf16 partial Grams).
    x = _same_on_all_ranks((16, 64), 100)
    local = x.chunk(world, dim=1)[rank]
    with_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        ours = ot.newton_schulz(local, 5, tp_group=everyone)
        theirs = eo_newton_schulz(local, 5, tp_group=everyone)
    finally:
        torch.set_float32_matmul_precision(with_precision)
    parts = [torch.empty_like(ours) for _ in range(world)], [torch.empty_like(theirs) for _ in range(world)]
    dist.all_gather(parts[0], ours)
    dist.all_gather(parts[1], theirs)
    a, b = torch.cat(parts[0], dim=1), torch.cat(parts[1], dim=1)
    assert ((a - b).norm() / b.norm()).item() <= MEDIUM_REL_TOL

    # Sub-groups of 2: two groups at once, each its own key.
    pair, _ = dist.new_subgroups_by_enumeration([[0, 1], [2, 3]])
    x = _same_on_all_ranks((32, 3), 7 + rank // 2)  # A different matrix per group.
    local = x.chunk(2, dim=0)[pair.rank()]
    ours = ot.newton_schulz(local, 5, transpose=True, tp_group=pair)
    _check(ours, eo_newton_schulz(local, 5, transpose=True, tp_group=pair), what="pair")
    _check(ours, eo_newton_schulz(x, 5, transpose=True).chunk(2, dim=0)[pair.rank()], what="pair whole")
    dist.all_gather_object(names, tp_groups._tp_groups[pair].name)
    assert names[0] == names[1] and names[2] == names[3] and names[0] != names[2]
    assert names[0].startswith("newton_schulz/tp2/")

    # A group of one holds the whole matrix.
    alone, _ = dist.new_subgroups_by_enumeration([[r] for r in range(world)])
    x = _same_on_all_ranks((24, 40), 9)
    _check(ot.newton_schulz(x, 5, tp_group=alone), eo_newton_schulz(x, 5, tp_group=alone), what="alone")

    # 3-D: one matrix is fine, a batch of several is not supported (EO normalizes it by one norm).
    x = _same_on_all_ranks((1, 8, 32), 10)
    local = x.chunk(world, dim=-1)[rank]
    _check(ot.newton_schulz(local, 5, tp_group=everyone), eo_newton_schulz(local, 5, tp_group=everyone), what="3-D")
    with pytest.raises(NotImplementedError, match="tp_group with a batch"):
        ot.newton_schulz(torch.randn(2, 8, 8), 5, tp_group=everyone)

    # Blocks that do not split one matrix: every rank sees the same shapes and raises the same error.
    bad = torch.randn(4 + (rank == 1), 8)
    with pytest.raises(ValueError, match="do not split one matrix along dim 1"):
        ot.newton_schulz(bad, 5, transpose=False, tp_group=everyone)

    # EO's newton_schulz_tp looks the function up in its module: with ours there, both of its modes run remotely.
    for shape in [(20, 16), (16, 32)]:
        x = _same_on_all_ranks(shape, 11)
        for partition_dim in (0, 1):
            if shape[partition_dim] % world:
                continue
            local = x.chunk(world, dim=partition_dim)[rank]
            for tp_mode in ("distributed", "duplicated"):
                kw = dict(steps=5, coefficient_type="quintic", tp_group=everyone, partition_dim=partition_dim,
                          tp_mode=tp_mode)
                theirs = muon_utils.newton_schulz_tp(local, **kw)
                calls = tp_groups._tp_groups[everyone].calls
                muon_utils.newton_schulz = ot.newton_schulz
                try:
                    ours = muon_utils.newton_schulz_tp(local, **kw)
                finally:
                    muon_utils.newton_schulz = eo_newton_schulz
                _check(ours, theirs, what=(shape, partition_dim, tp_mode))
                assert tp_groups._tp_groups[everyone].calls == calls + (tp_mode == "distributed")
    ot.set_default_client(None)


def test_tp_group_matches_emerging_optimizers_on_four_ranks(server):
    run_ranks(4, _tp_rank, server.address, timeout=300)
