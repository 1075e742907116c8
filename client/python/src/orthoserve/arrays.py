"""Conversion between user arrays (numpy arrays, torch tensors) and the wire's raw little-endian bytes.

torch is imported only when a torch tensor is seen, so the base client works without it.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Tuple

import numpy as np

from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

__all__ = ["ArrayInfo", "describe", "to_bytes", "from_bytes", "matrix_view", "ITEMSIZE"]

ITEMSIZE = {pb.DTYPE_FP32: 4, pb.DTYPE_BF16: 2, pb.DTYPE_FP16: 2}
_NUMPY = {"float32": pb.DTYPE_FP32, "float16": pb.DTYPE_FP16, "bfloat16": pb.DTYPE_BF16}


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtypes():
    import torch

    return {torch.float32: pb.DTYPE_FP32, torch.bfloat16: pb.DTYPE_BF16, torch.float16: pb.DTYPE_FP16}


class ArrayInfo:
    """What the client needs to send an array and rebuild a result like it: kind, dtype, shape, device."""

    __slots__ = ("is_torch", "wire_dtype", "shape", "dtype", "device")

    def __init__(self, is_torch: bool, wire_dtype: int, shape: Tuple[int, ...], dtype: Any, device: Any):
        self.is_torch = is_torch
        self.wire_dtype = wire_dtype
        self.shape = shape
        self.dtype = dtype
        self.device = device


def describe(x: Any, what: str) -> ArrayInfo:
    """ArrayInfo of a numpy array or torch tensor; TypeError for other objects or dtypes."""
    if _is_torch(x):
        table = _torch_dtypes()
        if x.dtype not in table:
            raise TypeError(f"orthoserve: {what} has dtype {x.dtype}; expected float32, bfloat16 or float16")
        return ArrayInfo(True, table[x.dtype], tuple(x.shape), x.dtype, x.device)
    if isinstance(x, np.ndarray):
        if x.dtype.name not in _NUMPY:
            raise TypeError(f"orthoserve: {what} has dtype {x.dtype}; expected float32, float16 or bfloat16")
        return ArrayInfo(False, _NUMPY[x.dtype.name], tuple(x.shape), x.dtype, None)
    raise TypeError(f"orthoserve: {what} is a {type(x).__name__}; expected a numpy array or a torch tensor")


def matrix_view(shape: Tuple[int, ...], nd: str = "flatten") -> Tuple[int, int]:
    """Rows and columns of the 2-D view of `shape` (the view blocks refer to; MatrixSpec.nd_layout in
    proto/orthoserve/v1/orthogonalizer.proto): nd "flatten" shape[0] x prod(shape[1:]); nd "batch"
    prod(shape[:-1]) x shape[-1] (the matrices shape[-2] x shape[-1] stacked by rows). The same for 2 dims."""
    if len(shape) < 2:
        raise ValueError(f"orthoserve: a matrix needs at least 2 dims, got shape {tuple(shape)}")
    if nd == "batch":
        return int(math.prod(shape[:-1])), int(shape[-1])
    return int(shape[0]), int(math.prod(shape[1:]))


def to_bytes(x: Any) -> memoryview:
    """The elements of x, row-major little-endian, as a read-only byte view (copies only when needed)."""
    if _is_torch(x):
        import torch

        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.numel() == 0:
            return memoryview(b"")
        raw = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
        return memoryview(raw.numpy()).cast("B")
    a = np.ascontiguousarray(x)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(a).cast("B") if a.size else memoryview(b"")


def from_bytes(buf: bytearray, info: ArrayInfo, shape: Tuple[int, ...]) -> Any:
    """An array like the one `info` describes (type, dtype, device) holding buf's elements with `shape`."""
    if info.is_torch:
        import torch

        if len(buf) == 0:
            return torch.empty(shape, dtype=info.dtype, device=info.device)
        t = torch.frombuffer(buf, dtype=info.dtype).reshape(shape)
        return t.to(info.device) if info.device is not None and info.device.type != "cpu" else t
    return np.frombuffer(buf, dtype=info.dtype.newbyteorder("<")).reshape(shape).astype(info.dtype, copy=False)
