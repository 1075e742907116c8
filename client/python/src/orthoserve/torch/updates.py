"""A step's updates orthogonalized by the service, as an optimizer sends them: plain tensors (and DTensors that are
not sharded) whole, in one call; sharded DTensors as one group step per shard group (dtensor_group), each rank with
its local block; either way through the optimizer's RegionTransport (shared-memory regions or bytes). Results come
back as their updates are (a DTensor for a DTensor). The optimizer's own arithmetic (momentum, weight decay, the
learning rate) is not here: see orthoserve.torch.muon."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from orthoserve import errors
from orthoserve.client import Client
from orthoserve.region_transport import RegionTransport
from orthoserve.torch.defaults import client_or_default
from orthoserve.torch.dtensors import (as_dtensor_of, dtensor_group, dtensor_shard, is_dtensor, partition_dim,
                                      sharded_mesh_dims)
from orthoserve.torch.fallback import falls_back, local
from orthoserve.torch.not_traced import not_traced
from orthoserve.torch.param_names import fit_names

__all__ = ["orthogonalize_updates"]

GroupKey = Tuple[str, int, int]  # (group name, rank, world): dtensor_group.


def _local_part(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if is_dtensor(t) else t


def _by_group(params: List[torch.Tensor], prefix: str) -> Tuple[List[int], Dict[GroupKey, List[int]]]:
    """The indices of the parameters sent whole, and those of the sharded DTensors by their shard group."""
    whole: List[int] = []
    groups: Dict[GroupKey, List[int]] = {}
    for i, p in enumerate(params):
        if is_dtensor(p) and sharded_mesh_dims(p):
            groups.setdefault(dtensor_group(p, prefix=prefix), []).append(i)
        else:
            whole.append(i)
    return whole, groups


def _shard_options(p: torch.Tensor, opts: Dict[str, Any], tp_mode: Optional[str], algorithm: str) -> Dict[str, Any]:
    """`opts` with the algorithm of sharded parameter p: its own `tp_mode` attribute or `tp_mode` (a TP algorithm
    along its partition dim), else its own `orthoserve_algorithm` attribute or `algorithm`."""
    kwargs = dict(opts)
    mode = getattr(p, "tp_mode", None) or tp_mode
    if mode is not None:
        kwargs.update(algorithm=f"tp_{mode}", partition_dim=partition_dim(p))
    else:
        kwargs.update(algorithm=getattr(p, "orthoserve_algorithm", None) or algorithm)
    return kwargs


@not_traced
def orthogonalize_updates(params: List[torch.Tensor], updates: List[torch.Tensor], *, client: Optional[Client],
                          transport: RegionTransport, options_of: Callable[[torch.Tensor], Dict[str, Any]],
                          name_of: Callable[[int, torch.Tensor], str], identity: Callable[[], Tuple[str, str]],
                          step: int, tp_mode: Optional[str] = None, algorithm: str = "auto",
                          timeout: Optional[float] = None, fallback: bool = False, what: str = "Muon",
                          group_prefix: str = "muon") -> List[torch.Tensor]:
    """The orthogonalized update of each parameter (same type, dtype and shape as the update).

    client: None for get_default_client(). options_of(p): the NS options of parameter p (orthoserve.options names,
    and "nd"); name_of(i, p): its matrix name (fitted to the server's Limits.max_name_bytes: param_names.fit_names).
    identity(): (job, run id) of the group steps, asked only when there are sharded DTensors. step: the group steps'
    step number. tp_mode, algorithm: the algorithm of sharded DTensors (_shard_options); group_prefix: the prefix of
    their group names (dtensor_group). fallback: compute the whole parameters locally with a warning when the
    service stays unreachable (sharded DTensors have no local fallback: their error propagates); `what` names the
    optimizer in that warning. Raises OrthoserveError. Under torch.compile a call is a graph break (not_traced)."""
    results: List[Optional[torch.Tensor]] = [None] * len(params)
    whole, groups = _by_group(params, group_prefix)
    for indices in groups.values():
        for i in indices:
            if params[i].dim() >= 3 and options_of(params[i]).get("nd") == "batch":
                raise ValueError(f"{what}: nd 'batch' is not supported for a sharded DTensor (parameter "
                                 f"{name_of(i, params[i])}, shape {tuple(params[i].shape)}); use nd 'flatten' for it")
    client = client_or_default(client) if params else None
    job, run_id = identity() if groups else ("", "")
    names: List[str] = []

    def matrix_name(i: int) -> str:
        """Parameter i's matrix name, fitted to the server's name limit (asked of the server, once, only when a
        name is long)."""
        if not names:
            names.extend(fit_names([name_of(j, p) for j, p in enumerate(params)],
                                   lambda: client.info(timeout=timeout).limits.max_name_bytes))
        return names[i]

    if whole:
        tensors = [_local_part(updates[i]) for i in whole]
        opts = [options_of(params[i]) for i in whole]
        try:
            named = [dict(o, name=matrix_name(i)) for i, o in zip(whole, opts)]
            out = transport.orthogonalize_batch(client, tensors, named, timeout=timeout)
        except errors.OrthoserveError as e:
            # The warning points at the optimizer's caller: here, the optimizer's method, then its caller.
            if not falls_back(fallback, e, f"{what} step {step}", stacklevel=4):
                raise
            out = [local(t, o, nd=o.get("nd", "flatten")) for t, o in zip(tensors, opts)]
        for i, o in zip(whole, out):
            results[i] = as_dtensor_of(updates[i], o)
    for (name, rank, world), indices in groups.items():
        shards = [dtensor_shard(matrix_name(i), params[i], data=_local_part(updates[i]),
                                **_shard_options(params[i], options_of(params[i]), tp_mode, algorithm))
                  for i in indices]
        group = client.group(job, name, rank, world, run_id=run_id)
        out = transport.group_step(group, step, shards, timeout=timeout)
        for i, o in zip(indices, out):
            results[i] = as_dtensor_of(updates[i], o)
    return results  # type: ignore[return-value]
