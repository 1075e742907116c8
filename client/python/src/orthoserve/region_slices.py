"""The shared-memory region slices one call names (orthoserve.shm): an input that is an array of an open region is
named as the spec's input_region instead of being sent, an out array as its result_region; and every region a call
names pins it to that region's server rank (Pins.address)."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from orthoserve import shm
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

__all__ = ["Pins", "name_regions"]


class Pins:
    """The shared-memory region slices one call's arrays name (among `regions`, the client's open regions), and
    the one server rank those regions pin the call to (`address`; None while no array is in a region)."""

    def __init__(self, regions: Sequence["shm.Region"]):
        self.regions = regions
        self.address: Optional[str] = None

    def input(self, array: Any, what: str) -> Optional[pb.RegionSlice]:
        """The slice holding `array`, or None when no open region holds it."""
        if not self.regions:
            return None
        region, piece = shm.find_slice(self.regions, array)
        if region is None:
            return None
        if self.address is not None and region.address != self.address:
            raise ValueError(f"orthoserve: {what} is in a region of {region.address}, but this call already "
                             f"names a region of {self.address}; one call goes to one server rank")
        self.address = region.address
        return piece

    def result(self, target: Any, what: str, shape: Tuple[int, ...], dtype: Any) -> pb.RegionSlice:
        """The slice of `target`, an out array that must be of an open region and of the result's shape and
        dtype (ValueError otherwise)."""
        piece = self.input(target, what)
        if piece is None:
            raise ValueError(f"orthoserve: {what} is not an array of one of this client's open regions")
        if tuple(target.shape) != tuple(shape) or target.dtype != dtype:
            raise ValueError(f"orthoserve: {what} has shape {tuple(target.shape)} and dtype {target.dtype};"
                             f" the result has shape {tuple(shape)} and dtype {dtype}")
        return piece


def name_regions(pins: Pins, spec: pb.MatrixSpec, data: Any, target: Any, what: str, out_what: str,
                 shape: Tuple[int, ...]) -> None:
    """Names in `spec` the region slice holding `data` (its input_region, when a region holds it) and that of
    `target` (its result_region; an out array of `shape` and data's dtype, or None)."""
    piece = pins.input(data, what)
    if piece is not None:
        spec.input_region.CopyFrom(piece)
    if target is not None:
        spec.result_region.CopyFrom(pins.result(target, out_what, shape, data.dtype))
