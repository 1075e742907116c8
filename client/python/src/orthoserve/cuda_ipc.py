"""CUDA IPC regions: GPU memory handed to a server on the same host and GPU, computed on where it is
(docs/shared_memory.md, "CUDA IPC regions").

    import torch
    from orthoserve import cuda_ipc
    buf = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")     # on the server's GPU
    with cuda_ipc.CudaRegion.of_tensor(client, address, buf) as region:
        g = buf[:n_bytes].view(torch.float32).view(rows, cols)         # write the momentum here
        spec.input_region.CopyFrom(region.slice_of(g))                 # MatrixSpec fields of a call
        spec.result_region.CopyFrom(region.slice_of(u))

The server must run `--backend cuda --shm-socket PATH` on the GPU that holds the memory (ServerInfo.shm_cuda_device
names it by UUID). The allocation is exported with the CUDA driver's cuIpcGetMemHandle (through ctypes on
libcuda.so.1, with no torch internals: any CUDA pointer will do), handed over on the server's Unix socket as one
CUDA_IPC line (the handle's bytes never go over gRPC) and registered with the client's token, so only this
client's tenant can use it. Synchronize the stream that wrote an input before the call that reads it; a result is
complete when its call has returned. Keep the memory allocated until close() has returned: CUDA leaves freeing it
while the server still has it open undefined (a region made by of_tensor holds the tensor until then).
"""

from __future__ import annotations

import ctypes
import socket
from typing import Any, NamedTuple, Optional, Tuple

import grpc

from orthoserve import errors, shm
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

__all__ = ["CudaRegion", "Export", "export", "device_uuid", "format_message", "hand_over", "HANDLE_BYTES",
           "ALIGNMENT"]

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
ALIGNMENT = 256  # A region starts at a multiple of this many bytes of its allocation.
_HANDOVER_TIMEOUT = 10.0
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9

_driver: Any = None


def _cuda() -> Any:
    """libcuda.so.1 with the calls used here, cuInit'ed once."""
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise errors.FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                                 f"CUDA IPC needs the CUDA driver (libcuda.so.1): {e}") from None
        _check(lib.cuInit(0), "cuInit")
        _driver = lib
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise errors.InternalError(grpc.StatusCode.INTERNAL, f"{what} failed with CUresult {result}")


def _format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_uuid(ordinal: int) -> str:
    """The UUID of CUDA device `ordinal` of this process (CUDA_VISIBLE_DEVICES applies), as nvidia-smi prints it."""
    lib = _cuda()
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)), "cuDeviceGet")
    raw = (ctypes.c_ubyte * 16)()
    get = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    _check(get(raw, dev), "cuDeviceGetUuid")
    return _format_uuid(bytes(raw))


class Export(NamedTuple):
    handle: bytes      # The allocation's cudaIpcMemHandle_t (64 bytes).
    device_uuid: str   # The GPU holding it.
    base: int          # The allocation's base address (the handle exports the whole allocation).
    size: int          # The allocation's bytes.


def export(ptr: int) -> Export:
    """Exports the CUDA allocation that holds device pointer `ptr`. The calling thread must have the pointer's
    context current (any CUDA runtime call on it does that, e.g. torch.cuda.synchronize())."""
    lib = _cuda()
    ordinal = ctypes.c_int()
    _check(lib.cuPointerGetAttribute(ctypes.byref(ordinal), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     ctypes.c_uint64(ptr)), "cuPointerGetAttribute (is it device memory?)")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
           "cuMemGetAddressRange")
    handle = (ctypes.c_ubyte * HANDLE_BYTES)()
    _check(lib.cuIpcGetMemHandle(handle, base), "cuIpcGetMemHandle (a cudaMalloc'd allocation? not expandable "
                                                "segments or VMM memory)")
    return Export(bytes(handle), device_uuid(ordinal.value), base.value, size.value)


def format_message(device: str, offset: int, size: int, handle: bytes) -> bytes:
    """The handover socket's CUDA_IPC line for bytes [offset, offset + size) of the allocation `handle` exports."""
    if len(handle) != HANDLE_BYTES:
        raise ValueError(f"orthoserve: a CUDA IPC handle has {HANDLE_BYTES} bytes, not {len(handle)}")
    if offset < 0 or offset % ALIGNMENT or size < 1:
        raise ValueError(f"orthoserve: a region needs offset >= 0, a multiple of {ALIGNMENT}, and size >= 1 "
                         f"(got {offset}, {size})")
    return f"CUDA_IPC {device} {offset} {size} {handle.hex()}\n".encode("ascii")


def hand_over(path: str, message: bytes, timeout: float = _HANDOVER_TIMEOUT) -> Tuple[str, socket.socket]:
    """Sends a CUDA_IPC line on the server's socket at `path`; returns the ticket and the connection, the region's
    lifeline (shm.hand_over: keep it open while the region is held). Raises OrthoserveError with the server's code
    when it refuses (FailedPreconditionError: a cpu backend, or another GPU)."""
    return shm.hand_over(path, lambda s: s.sendall(message), "the CUDA IPC handle", timeout)


class CudaRegion:
    """Device memory [ptr, ptr + size) registered as a region on the server rank at `address`; see the module."""

    def __init__(self, client: shm.RegionHost, address: str, ptr: int, size: int, name: str = "",
                 timeout: Optional[float] = None, keep: Any = None):
        if size <= 0:
            raise ValueError(f"orthoserve: a region needs at least one byte, got size={size}")
        info = client.info(address, refresh=True, timeout=timeout)
        if not info.shm_socket or not info.shm_cuda_device:
            raise errors.FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the server at {address} takes no CUDA IPC regions (it needs --backend cuda and --shm-socket)")
        e = export(ptr)
        if e.device_uuid != info.shm_cuda_device:
            raise errors.FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the memory is on GPU {e.device_uuid}, the server at {address} computes on {info.shm_cuda_device}")
        # The region starts at the aligned offset at or before ptr; slices are counted from there.
        self._start = e.base + (ptr - e.base) // ALIGNMENT * ALIGNMENT
        self._end = ptr + size
        if self._end > e.base + e.size:
            raise ValueError(f"orthoserve: {size} bytes at {ptr:#x} run past their allocation")
        ticket, lifeline = hand_over(info.shm_socket, format_message(e.device_uuid, self._start - e.base,
                                                                     self._end - self._start, e.handle))
        shm.hold_lifeline(self, lifeline)
        self.client = client  # The client it is registered with (its calls go through client.channels).
        self._keep = keep
        self.address = address
        self.name = name
        self.device = e.device_uuid
        self.id = ""
        try:
            self._stub, self.id = shm.register(client.channels, address, ticket, name, timeout)
        except errors.OrthoserveError:
            shm.close_lifeline(self)
            raise

    @classmethod
    def of_tensor(cls, client: shm.RegionHost, address: str, tensor: Any, name: str = "",
                  timeout: Optional[float] = None) -> "CudaRegion":
        """A region over a contiguous CUDA tensor's bytes (torch, or anything with data_ptr/numel/element_size),
        which it keeps referenced until close()."""
        if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
            raise ValueError("orthoserve: a CUDA region's tensor must be contiguous")
        return cls(client, address, int(tensor.data_ptr()), int(tensor.numel()) * int(tensor.element_size()),
                   name, timeout, keep=tensor)

    def slice_of(self, tensor: Any) -> Optional[pb.RegionSlice]:
        """The RegionSlice of a contiguous CUDA tensor lying wholly in this region, or None."""
        if not self.id or (hasattr(tensor, "is_contiguous") and not tensor.is_contiguous()):
            return None
        start = int(tensor.data_ptr())
        nbytes = int(tensor.numel()) * int(tensor.element_size())
        if start < self._start or start + nbytes > self._end:
            return None
        return pb.RegionSlice(region_id=self.id, offset=start - self._start, size=nbytes)

    def close(self, timeout: Optional[float] = None) -> None:
        """Unregisters the region; the server answers once no step uses it and it closed its mapping. Only then is
        the memory let go of (the tensor reference). Closes the lifeline either way (when the unregister failed, the
        server drops the region on its own, and the tensor stays referenced). Idempotent."""
        try:
            region_id, self.id = self.id, ""  # Once.
            if region_id:
                shm.unregister(self._stub, self.client.channels, region_id, timeout)
            self._keep = None
        finally:
            shm.close_lifeline(self)

    def __enter__(self) -> "CudaRegion":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CudaRegion(id={self.id or 'closed'}, device={self.device}, address={self.address!r})"
