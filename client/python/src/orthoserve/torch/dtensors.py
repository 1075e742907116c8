"""DTensor helpers: this rank's block of a sharded DTensor in its 2-D view (dtensor_block), the trainer group that
together holds a DTensor's blocks (dtensor_group), the Shard of this rank's block for a group step (dtensor_shard),
and a local result as the DTensor of its update (as_dtensor_of)."""

from __future__ import annotations

import hashlib
from typing import Any, List, Optional, Tuple

import torch

from orthoserve import layout

__all__ = ["is_dtensor", "sharded_mesh_dims", "dtensor_block", "dtensor_group", "dtensor_shard", "partition_dim",
           "as_dtensor_of"]


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed tensors
        return None
    return DTensor


def is_dtensor(x: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(x, cls)


def sharded_mesh_dims(dt: Any) -> List[int]:
    """The mesh dims that shard DTensor `dt` (Shard placements on dims of more than one rank); ValueError for a
    placement other than Shard and Replicate."""
    from torch.distributed.tensor import Replicate, Shard

    dims = []
    for d, placement in enumerate(dt.placements):
        if isinstance(placement, Replicate) or dt.device_mesh.size(d) == 1:
            continue
        if not isinstance(placement, Shard):
            raise ValueError(f"orthoserve: placement {placement} of a parameter is not supported (Shard/Replicate)")
        dims.append(d)
    return dims


def dtensor_block(dt: Any) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """((row_offset, col_offset), (rows, cols)) of this rank's local shard of DTensor `dt` in its 2-D view.

    Shard(0) placements give row blocks, Shard(1) column blocks (torch.chunk sizes: the last ranks may hold
    shorter or empty blocks); ValueError for layouts that are not rectangles of the view."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local_shape, offset = compute_local_shape_and_global_offset(dt.shape, dt.device_mesh, dt.placements)
    return layout.block_of(tuple(dt.shape), tuple(local_shape), tuple(offset))


def dtensor_group(dt: Any, prefix: str = "g") -> Tuple[str, int, int]:
    """(group name, rank, world) of the trainer group that together holds DTensor `dt`'s blocks.

    The group is the ranks of the mesh dims that shard `dt` (W = product of their sizes, rank = the mixed-radix
    index of this rank's coordinates on them); ranks that differ on replicated dims are separate groups, told
    apart in the name. The name is the same on every rank of the group. world 1 means "not sharded"."""
    mesh = dt.device_mesh
    dims = sharded_mesh_dims(dt)
    coords = mesh.get_coordinate()
    if coords is None:
        raise ValueError("orthoserve: this rank is not part of the DTensor's mesh")
    rank, world = 0, 1
    for d in dims:
        rank = rank * mesh.size(d) + coords[d]
        world *= mesh.size(d)
    layout_key = hashlib.sha1(repr((tuple(mesh.mesh.shape), mesh.mesh.flatten().tolist())).encode()).hexdigest()[:10]
    replica = [coords[d] for d in range(mesh.ndim) if d not in dims]
    name = f"{prefix}/mesh-{layout_key}/shard{''.join(map(str, dims)) or '-'}/at{'.'.join(map(str, replica)) or '-'}"
    return name, rank, world


def dtensor_shard(name: str, dt: Any, data: Optional[torch.Tensor] = None, **kwargs: Any) -> layout.Shard:
    """The Shard of this rank's block of DTensor `dt` (data: a tensor of the local shard's shape, default the
    local shard itself); kwargs: algorithm, partition_dim and NS options as for orthoserve.Shard."""
    offset, _ = dtensor_block(dt)
    local = dt.to_local() if data is None else data
    return layout.Shard(name, tuple(dt.shape), offset, local, **kwargs)


def partition_dim(dt: Any) -> int:
    """The dim (0 or 1) along which DTensor `dt`'s blocks split it, for the TP modes; ValueError otherwise."""
    dims = {dt.placements[d].dim for d in sharded_mesh_dims(dt)}
    if len(dims) != 1 or next(iter(dims)) not in (0, 1):
        raise ValueError(f"orthoserve: TP modes need blocks split along one of dims 0/1, got {dt.placements}")
    return next(iter(dims))


def as_dtensor_of(update: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local`, the result of this rank's part of `update`, as `update` is: a DTensor of its mesh, placements, shape
    and stride when `update` is one, else `local` itself."""
    if not is_dtensor(update):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, update.device_mesh, update.placements, run_check=False,
                              shape=update.shape, stride=update.stride())
