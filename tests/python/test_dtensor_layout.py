"""Block and group helpers read off real DTensors (4 gloo ranks): each rank's block in the 2-D view is exactly
where its local shard sits in the full tensor, and the group (name, rank, world) covers the sharded mesh dims."""

import torch

from dist_util import run_ranks


def _check_layouts(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from orthoserve.torch import dtensor_block, dtensor_group, dtensor_shard

    cases = [(None, (4,), (Shard(0),), (9, 6)), (None, (4,), (Shard(1),), (5, 7)),
             (None, (4,), (Shard(0),), (3, 4, 2)), (None, (4,), (Shard(1),), (5, 6, 2)),
             (None, (2, 2), (Replicate(), Shard(0)), (7, 3)), (None, (2, 2), (Shard(0), Shard(1)), (6, 8))]
    names = []
    meshes = {(4,): init_device_mesh("cpu", (4,)), (2, 2): init_device_mesh("cpu", (2, 2))}
    for _, mesh_shape, placements, shape in cases:
        mesh = meshes[mesh_shape]
        full = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
        dt = distribute_tensor(full, mesh, placements)
        (r0, c0), (rows, cols) = dtensor_block(dt)
        view = full.reshape(shape[0], -1)
        local = dt.to_local()
        assert torch.equal(view[r0:r0 + rows, c0:c0 + cols], local.reshape(rows, cols)), (shape, placements)
        name, grank, gworld = dtensor_group(dt)
        coords = mesh.get_coordinate()
        if placements == (Replicate(), Shard(0)):
            assert (grank, gworld) == (coords[1], 2) and name.endswith(f"/shard1/at{coords[0]}")
        elif len(mesh_shape) == 2:
            assert (grank, gworld) == (coords[0] * 2 + coords[1], 4) and name.endswith("/shard01/at-")
        else:
            assert (grank, gworld) == (rank, 4)
        shard = dtensor_shard("w", dt)
        assert shard.offset == (r0, c0) and shard.block == (rows, cols) and shard.global_shape == tuple(shape)
        names.append(name)
    # Group names agree across the ranks of a group.
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, names)
    assert all(g[0] == names[0] for g in gathered)


def test_dtensor_blocks_and_groups_on_four_ranks():
    run_ranks(4, _check_layouts)
