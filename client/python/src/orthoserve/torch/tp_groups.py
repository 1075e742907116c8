"""newton_schulz(tp_group=...) as a group step: the ranks of a torch.distributed process group each hold a block of
one matrix, and together make one TP_DISTRIBUTED group step of the service (orthoserve.Group).

Each process group gets a key agreed on first use (group rank 0 draws it and broadcasts it), the run id of its steps,
and a count of its calls: every rank makes the same calls in the same order, as with Emerging-Optimizers'
collectives, so the count is the step number of the group's next step.
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref
from typing import Any, Dict

import torch

from orthoserve import layout, runs
from orthoserve.torch.defaults import get_default_client, region_transport

__all__ = ["newton_schulz_tp"]


class _TpGroup:
    """What the ranks of one torch.distributed process group share for newton_schulz(tp_group=...): the group
    key (agreed once: group rank 0 draws it and broadcasts it), the run id of its steps, and the number of calls so
    far (the step number of the next group step; every rank makes the same calls in the same order, as with EO's
    collectives)."""

    __slots__ = ("name", "run_id", "calls")

    def __init__(self, name: str, run_id: str):
        self.name = name
        self.run_id = run_id
        self.calls = 0


_tp_groups: "weakref.WeakKeyDictionary[Any, _TpGroup]" = weakref.WeakKeyDictionary()
_tp_lock = threading.Lock()


def _tp_state(tp_group: Any, device: torch.device) -> _TpGroup:
    import torch.distributed as dist

    with _tp_lock:
        state = _tp_groups.get(tp_group)
    if state is not None:
        return state
    # Two random 62-bit words from group rank 0, the same on every rank of the group: a key no other group, and no
    # other run against the same fleet, uses (the server keys group steps by job, group and step number).
    words = torch.tensor([secrets.randbits(62), secrets.randbits(62)] if dist.get_rank(tp_group) == 0 else [0, 0],
                         dtype=torch.int64, device=device)
    dist.broadcast(words, group=tp_group, group_src=0)
    key = "".join(f"{int(w):016x}" for w in words.tolist())
    # The run id: $ORTHOSERVE_RUN_ID / $TORCHELASTIC_RUN_ID, or one agreed over the default group before (no new
    # collective here: not every rank of the default group need call newton_schulz with a tp_group), else the key
    # just agreed, which only this run's ranks of this group hold.
    run_id = runs.find_run_id(agree=False) or f"tp-{key}"
    state = _TpGroup(f"newton_schulz/tp{dist.get_world_size(tp_group)}/{key}", run_id)
    with _tp_lock:
        _tp_groups[tp_group] = state
    return state


def newton_schulz_tp(x: torch.Tensor, opts: Dict[str, Any], partition_dim: int, tp_group: Any) -> torch.Tensor:
    """EO's distributed newton_schulz (tp_group set) as a TP_DISTRIBUTED group step of the group's ranks: this rank's
    `x` is its block of the matrix split along `partition_dim` (0: rows, 1: columns) in group-rank order."""
    import torch.distributed as dist

    rank, world = dist.get_rank(tp_group), dist.get_world_size(tp_group)
    state = _tp_state(tp_group, x.device)
    # The blocks' extents along the partition dim (the other dim must agree): the global shape and this offset.
    sizes = [torch.zeros(2, dtype=torch.int64, device=x.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor(list(x.shape), dtype=torch.int64, device=x.device), group=tp_group)
    shapes = [tuple(int(v) for v in s.tolist()) for s in sizes]
    other = 1 - partition_dim
    if any(s[other] != x.shape[other] for s in shapes):
        raise ValueError(f"orthoserve.torch.newton_schulz: the ranks of tp_group hold blocks of shapes {shapes}, "
                         f"which do not split one matrix along dim {partition_dim} (transpose="
                         f"{partition_dim == 0}: the blocks must split dim {partition_dim} and share dim {other})")
    total = sum(s[partition_dim] for s in shapes)
    before = sum(s[partition_dim] for s in shapes[:rank])
    global_shape = (total, x.shape[1]) if partition_dim == 0 else (x.shape[0], total)
    offset = (before, 0) if partition_dim == 0 else (0, before)
    step = state.calls
    state.calls += 1  # Counted before the call: a failed step's number is never used again.
    job = os.environ.get("ORTHOSERVE_JOB") or "orthoserve.torch"
    client = get_default_client()
    shard = layout.Shard("x", global_shape, offset, x, algorithm="tp_distributed", partition_dim=partition_dim,
                         **opts)
    group = client.group(job, state.name, rank, world, run_id=state.run_id)
    [out] = region_transport(client).group_step(group, step, [shard])
    return out
