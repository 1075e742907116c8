"""Blocks of sharded matrices: the Shard a trainer rank sends, and the torch.chunk layouts of Shard(0)/Shard(1).

Offsets and block extents are in the matrix's 2-D view (rows = shape[0], cols = prod(shape[1:])), as on the
wire. Splitting tensor dim 1 of an N-d shape is a column block of that view (dim 1 is the outermost of the
columns), so Shard(0) gives row blocks and Shard(1) column blocks.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

from orthoserve import arrays, options as options_lib

__all__ = ["Shard", "chunk_sizes", "chunk_blocks", "block_of"]


def chunk_sizes(n: int, world: int) -> List[int]:
    """Sizes torch.chunk (and DTensor's Shard) gives each of `world` ranks for `n` elements along a dim:
    ceil(n / world) each, the last ranks shorter or empty."""
    if world < 1:
        raise ValueError(f"orthoserve: world must be >= 1, got {world}")
    chunk = -(-n // world)
    sizes = []
    for _ in range(world):
        sizes.append(min(chunk, n))
        n -= sizes[-1]
    return sizes


def chunk_blocks(global_shape: Sequence[int], world: int, dim: int) -> List[Tuple[Tuple[int, int], Tuple[int, int]]]:
    """Per rank, ((row_offset, col_offset), (rows, cols)) of the 2-D view under Shard(dim) over `world` ranks.

    dim is 0 (row blocks) or 1 (column blocks: tensor dim 1, times the size of the dims after it)."""
    rows, cols = arrays.matrix_view(tuple(global_shape))
    if dim not in (0, 1):
        raise ValueError(f"orthoserve: only Shard(0) and Shard(1) map to blocks of the 2-D view, got dim {dim}")
    inner = math.prod(global_shape[2:]) if len(global_shape) > 2 else 1
    sizes = chunk_sizes(int(global_shape[dim]), world)
    blocks = []
    offset = 0
    for size in sizes:
        if dim == 0:
            blocks.append(((offset, 0), (size, cols)))
        else:
            blocks.append(((0, offset * inner), (rows, size * inner)))
        offset += size
    return blocks


def block_of(global_shape: Sequence[int], local_shape: Sequence[int], global_offset: Sequence[int]):
    """((row_offset, col_offset), (rows, cols)) in the 2-D view of a local tensor block of an N-d tensor.

    The block must be a rectangle of the 2-D view: split along dim 0 and/or dim 1 only."""
    global_shape, local_shape, global_offset = tuple(global_shape), tuple(local_shape), tuple(global_offset)
    if len(global_shape) < 2 or len(local_shape) != len(global_shape) or len(global_offset) != len(global_shape):
        raise ValueError(f"orthoserve: block {local_shape} at {global_offset} does not fit shape {global_shape}")
    if any(o != 0 for o in global_offset[2:]) or tuple(local_shape[2:]) != tuple(global_shape[2:]):
        raise ValueError(f"orthoserve: a block split along dims >= 2 ({local_shape} of {global_shape}) is not a "
                         "rectangle of the 2-D view")
    inner = math.prod(global_shape[2:]) if len(global_shape) > 2 else 1
    return ((global_offset[0], global_offset[1] * inner), (local_shape[0], local_shape[1] * inner))


class Shard:
    """One trainer rank's block of one matrix in a group step.

    Args:
      name: the matrix's name, the same on every rank of the group (unique within a step).
      global_shape: the whole matrix's shape (>= 2 dims).
      offset: (row_offset, col_offset) of this block in the 2-D view.
      data: the block (numpy array or torch tensor); its 2-D view (data.shape[0] x prod(rest)) is the block's
        rows x cols. An empty block (0 rows or cols) is allowed: the rank takes part without data.
      algorithm: "auto" (default), "row_sharded", "gathered", "tp_duplicated", "tp_distributed", "tp_blockwise".
      partition_dim: 0 or 1 for the TP algorithms (the 2-D view's dim the blocks split).
      nd: how a global shape of >= 3 dims is read (MatrixSpec.nd_layout): "flatten" (default; the 2-D view is
        shape[0] x prod(rest)) or "batch" (prod(shape[:-2]) matrices shape[-2] x shape[-1]; the 2-D view that
        offset and the block refer to is prod(shape[:-1]) x shape[-1], and data's is likewise).
      **options: NS options by name (see orthoserve.options.ns_options).
    """

    def __init__(self, name: str, global_shape: Sequence[int], offset: Sequence[int], data: Any,
                 algorithm: Optional[str] = "auto", partition_dim: Optional[int] = None, nd: str = "flatten",
                 **options: Any):
        if nd not in ("flatten", "batch"):
            raise ValueError(f"orthoserve: Shard '{name}' nd must be 'flatten' or 'batch', got {nd!r}")
        self.name = str(name)
        self.global_shape = tuple(int(d) for d in global_shape)
        if len(offset) != 2:
            raise ValueError(f"orthoserve: Shard '{name}' offset must be (row_offset, col_offset), got {offset}")
        self.offset = (int(offset[0]), int(offset[1]))
        self.data = data
        self.algorithm = algorithm
        self.partition_dim = partition_dim
        self.nd = nd
        options_lib.ns_options(options)  # Validates names and values now, not mid-stream.
        self.options = dict(options)
        self.info = arrays.describe(data, f"Shard '{name}' data")
        rows, cols = arrays.matrix_view(self.global_shape, nd)
        if len(self.info.shape) >= 2:
            self.block = arrays.matrix_view(self.info.shape, nd)
        elif len(self.info.shape) == 1 and self.info.shape[0] == 0:
            self.block = (0, cols)
        else:
            raise ValueError(f"orthoserve: Shard '{name}' data must have >= 2 dims, got {self.info.shape}")
        r0, c0 = self.offset
        if r0 < 0 or c0 < 0 or r0 + self.block[0] > rows or c0 + self.block[1] > cols:
            raise ValueError(f"orthoserve: Shard '{name}': block {self.block} at {self.offset} does not fit the "
                             f"{rows}x{cols} view of {self.global_shape}")
