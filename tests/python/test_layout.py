"""Block layouts: torch.chunk sizes for Shard(0)/Shard(1), blocks of N-d tensors in the 2-D view, and Shard
validation."""

import numpy as np
import pytest
import torch

import orthoserve
from orthoserve import layout


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 6])
def test_chunk_sizes_match_torch_chunk(n, world):
    expected = [c.shape[0] for c in torch.arange(n).chunk(world)]
    expected += [0] * (world - len(expected))  # DTensor pads the missing chunks with empty ones.
    assert layout.chunk_sizes(n, world) == expected


@pytest.mark.parametrize("shape", [(7, 5), (5, 7, 3), (2, 9)])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_chunk_blocks_tile_the_view_like_torch_chunk(shape, dim, world):
    full = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    view = full.reshape(shape[0], -1)
    chunks = list(full.chunk(world, dim=dim))
    blocks = layout.chunk_blocks(shape, world, dim)
    assert len(blocks) == world
    covered = torch.zeros_like(view)
    for rank, ((r0, c0), (rows, cols)) in enumerate(blocks):
        block = view[r0:r0 + rows, c0:c0 + cols]
        covered[r0:r0 + rows, c0:c0 + cols] += 1
        if rank < len(chunks):
            assert torch.equal(block, chunks[rank].reshape(chunks[rank].shape[0], -1))
        else:
            assert block.numel() == 0
    assert torch.equal(covered, torch.ones_like(view))


def test_block_of_nd():
    assert layout.block_of((8, 4, 3), (8, 2, 3), (0, 2, 0)) == ((0, 6), (8, 6))
    assert layout.block_of((8, 4), (3, 4), (6, 0)) == ((6, 0), (3, 4))
    with pytest.raises(ValueError, match="not a rectangle"):
        layout.block_of((8, 4, 3), (8, 4, 1), (0, 0, 2))


def test_shard_checks_its_block():
    data = np.zeros((3, 4), np.float32)
    s = orthoserve.Shard("w", (6, 4), (3, 0), data, steps=3)
    assert s.block == (3, 4) and s.options == {"steps": 3}
    with pytest.raises(ValueError, match="does not fit"):
        orthoserve.Shard("w", (6, 4), (4, 0), data)
    with pytest.raises(TypeError, match="unknown option"):
        orthoserve.Shard("w", (6, 4), (0, 0), data, step=3)
    empty = orthoserve.Shard("w", (6, 4), (6, 0), np.zeros((0, 4), np.float32))
    assert empty.block == (0, 4)
