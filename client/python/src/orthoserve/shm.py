"""Shared-memory regions: matrices handed to a server on the same host without a copy (docs/shared_memory.md).

    with client.region(64 << 20) as region:           # a sealed memfd, registered on the client's server rank
        g = region.array((1024, 1024), np.float32)     # numpy arrays backed by the region
        u = region.array((1024, 1024), np.float32)
        g[:] = momentum
        client.orthogonalize([g], out=[u])              # read and written in place by the server
        t = region.tensor((1024, 1024), torch.bfloat16) # torch tensors (CPU) backed by it, likewise

A Region is a memfd (Linux) sealed against shrinking, mapped here and handed over on the server's Unix domain socket
(ServerInfo.shm_socket; the server must run with --shm-socket), then registered with the client's token through the
SharedMemory service; only this client's tenant can use it. Arrays from `array` are views of the mapping, and so are
the CPU torch tensors from `tensor` (torch is imported only there): a call given such an array or tensor (as input,
or in `out=`) names the region's slice instead of sending bytes, and goes to the region's server rank only.
orthoserve.torch stages its matrices in a region on its own (orthoserve.region_transport). Do not write an array the
server is reading, or read a result array, while its call runs. `close` unregisters (waiting for the server's steps
that use it) and unmaps.

Each region keeps the connection it was handed over on open (its lifeline) until `close`: when this process dies
without closing its regions (SIGKILL, OOM), the kernel closes the connection and the server drops them. A child this
process forks does not hold its parent's lifelines (they are closed in the child at the fork): the parent's regions go
with the parent. The server ends the lifeline when it drops a region: `dropped()` looks, without a call.

A region calls the server through the client it is registered with, seen as a RegionHost: the client's `info` (the
server's handover socket) and its `channels` (orthoserve.channels: the SharedMemory stub of an address, the deadline
and metadata of a call). This module imports nothing of orthoserve.client; orthoserve.cuda_ipc uses its hand-over,
lifeline and registration for CUDA memory.
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import sys
import threading
import weakref
from typing import Any, Callable, Optional, Protocol, Sequence, Tuple

import grpc
import numpy as np

from orthoserve import errors
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc
from orthoserve.channels import Channels

__all__ = ["Region", "RegionHost", "ALIGNMENT", "hand_over", "hold_lifeline", "close_lifeline", "register",
           "unregister", "find_slice"]

ALIGNMENT = 64  # Bytes: every array `Region.array` hands out starts at a multiple of this offset.
_HANDOVER_TIMEOUT = 10.0  # Seconds for the socket's answer.


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def hand_over(path: str, send: Callable[[socket.socket], None], what: str,
              timeout: float = _HANDOVER_TIMEOUT) -> Tuple[str, socket.socket]:
    """Connects to the handover socket at `path`, lets `send` write the message on it and reads the one-line answer.
    Returns the ticket and the connection, which the caller keeps open for as long as it holds the region (its
    lifeline: the server drops the region when it closes) and sends nothing more on. Raises OrthoserveError (the
    server's code; UnavailableError when the socket cannot be reached) naming `what` when it refuses."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        send_error: Optional[OSError] = None
        try:
            s.connect(path)
            try:
                send(s)
            except OSError as e:
                # A server that refuses on accept (a uid it does not take, too many hand-overs at once) answers
                # and closes before reading: the send may fail, and the answer says why.
                send_error = e
            answer = b""
            while not answer.endswith(b"\n") and len(answer) < 4096:  # One short line.
                part = s.recv(4096)
                if not part:
                    break
                answer += part
        except OSError as e:
            raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                          f"the shared-memory socket {path} did not take {what}: {send_error or e}"
                                          ) from None
        line = answer.decode("utf-8", "replace").strip()
        if send_error is not None and not line.startswith("ERR "):
            raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                          f"the shared-memory socket {path} did not take {what}: {send_error}")
        if line.startswith("OK "):
            s.settimeout(None)
            return line[3:], s
        code_name, _, message = line[4:].partition(" ") if line.startswith("ERR ") else ("UNKNOWN", "", line)
        code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.UNKNOWN)
        raise errors.error_from_code(code.value[0], f"the server refused {what}: {message or line!r}")
    except BaseException:
        s.close()
        raise


class RegionHost(Protocol):
    """What a region needs of the client it is registered with (an orthoserve.Client is one)."""

    channels: Channels

    def info(self, address: Optional[str] = None, *, refresh: bool = False,
             timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo of `address` (ServerInfo.shm_socket: the server's handover socket)."""


# Regions whose lifeline is open in this process: a forked child closes its copies (os.register_at_fork below).
_with_lifelines: "weakref.WeakSet[Any]" = weakref.WeakSet()


def hold_lifeline(owner: Any, lifeline: socket.socket) -> None:
    """Records that `owner` (a Region or CudaRegion) holds `lifeline`; it is kept in the owner's `_lifeline`, which
    only this function and close_lifeline touch."""
    owner._lifeline = lifeline
    _with_lifelines.add(owner)


def close_lifeline(owner: Any) -> None:
    """Closes `owner`'s lifeline, if open: the server drops whatever is still registered through it."""
    lifeline, owner._lifeline = getattr(owner, "_lifeline", None), None
    _with_lifelines.discard(owner)
    if lifeline is not None:
        lifeline.close()


def _close_lifelines_in_child() -> None:
    # The child's copies only: the parent's connections stay open, so its regions live as long as the parent.
    for owner in list(_with_lifelines):
        close_lifeline(owner)


os.register_at_fork(after_in_child=_close_lifelines_in_child)


def register(channels: Channels, address: str, ticket: str, name: str,
             timeout: Optional[float]) -> Tuple[pb_grpc.SharedMemoryStub, str]:
    """Registers the region handed over for `ticket` on `address` under `name`; returns the SharedMemory stub it was
    registered through and the region's id. Raises OrthoserveError (the server's code)."""
    stub = channels.shared_memory(address)
    try:
        region = stub.RegisterRegion(pb.RegisterRegionRequest(ticket=ticket, name=name),
                                     timeout=channels.deadline(timeout), metadata=channels.metadata)
    except grpc.RpcError as e:
        raise errors.error_from_rpc(e) from None
    return stub, region.region_id


def unregister(stub: pb_grpc.SharedMemoryStub, channels: Channels, region_id: str, timeout: Optional[float]) -> None:
    """Unregisters region `region_id` through `stub` (register's): the server answers when no step uses it any more.
    Raises OrthoserveError (the server's code)."""
    try:
        stub.UnregisterRegion(pb.UnregisterRegionRequest(region_id=region_id), timeout=channels.deadline(timeout),
                              metadata=channels.metadata)
    except grpc.RpcError as e:
        raise errors.error_from_rpc(e) from None


class Region:
    """A registered shared-memory region of `size` bytes on one server rank (`address`). Use Client.region()."""

    def __init__(self, client: RegionHost, address: str, size: int, name: str = "",
                 timeout: Optional[float] = None):
        if size <= 0:
            raise ValueError(f"orthoserve: a region needs at least one byte, got size={size}")
        info = client.info(address, refresh=True, timeout=timeout)
        if not info.shm_socket:
            raise errors.FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the server at {address} does not take shared-memory regions (start it with --shm-socket)")
        self.client = client  # The client it is registered with (its calls go through client.channels).
        self.address = address
        self.size = size
        self.name = name
        self.id = ""
        self._lock = threading.Lock()
        self._next = 0  # The bump allocator of `array` and `tensor`.
        self._lifeline: Optional[socket.socket] = None
        self._fd = os.memfd_create(f"orthoserve-{name or 'region'}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self._fd, size)
            import fcntl

            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._base = np.frombuffer(self._map, dtype=np.uint8)
            self._mapped_at = self._base.__array_interface__["data"][0]  # Where the mapping starts here.
            fd = self._fd
            ticket, lifeline = hand_over(info.shm_socket, lambda s: socket.send_fds(s, [b"M"], [fd]), "the memfd")
            hold_lifeline(self, lifeline)
            self._stub, self.id = register(client.channels, address, ticket, name, timeout)
        except BaseException:
            self._release_memory()
            raise

    # -- arrays ----------------------------------------------------------------------------------------------

    def _place(self, nbytes: int, itemsize: int, offset: Optional[int]) -> int:
        """The offset of `nbytes` bytes of elements of `itemsize` bytes: `offset`, or (None) the next multiple of
        ALIGNMENT after what was handed out so far, which then moves past them. ValueError when the region is
        closed, the offset is not a multiple of `itemsize`, or the bytes do not fit."""
        with self._lock:
            if self._map is None:
                raise ValueError("orthoserve: the region is closed")
            start = (self._next + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT if offset is None else int(offset)
            if start % itemsize:
                raise ValueError(f"orthoserve: offset {start} is not a multiple of the element size, {itemsize} bytes")
            if start < 0 or nbytes < 0 or start > self.size or nbytes > self.size - start:
                raise ValueError(f"orthoserve: {nbytes} bytes at offset {start} do not fit a region of {self.size}")
            if offset is None:
                self._next = start + nbytes
            return start

    def array(self, shape: Sequence[int], dtype: Any = np.float32, offset: Optional[int] = None) -> np.ndarray:
        """A C-contiguous numpy array of `shape` and `dtype` (float32 or float16) backed by the region, at
        `offset` (default: after the arrays and tensors handed out so far, aligned to ALIGNMENT; the server takes
        only offsets that are a multiple of the element size). ValueError when it does not fit or is misaligned."""
        dtype = np.dtype(dtype)
        if dtype.name not in ("float32", "float16"):
            raise TypeError(f"orthoserve: region arrays are float32 or float16, not {dtype}")
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = self._place(nbytes, dtype.itemsize, offset)
        return self._base[start:start + nbytes].view(dtype).reshape(shape)

    def tensor(self, shape: Sequence[int], dtype: Any = None, offset: Optional[int] = None) -> Any:
        """A contiguous CPU torch tensor of `shape` and `dtype` (torch.float32 by default, torch.bfloat16 or
        torch.float16) backed by the region, placed as `array` places arrays (the two share the region's space).
        Usable wherever a region array is: as an input, and in `out=`. Needs torch (imported here); TypeError for
        another dtype, ValueError when it does not fit or is misaligned."""
        import torch

        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"orthoserve: region tensors are torch.float32, torch.bfloat16 or torch.float16, not "
                            f"{dtype}")
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"orthoserve: negative dimension in shape {shape}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        start = self._place(nbytes, itemsize, offset)
        # A view of the numpy view of the mapping: it keeps the mapping alive as arrays do (see close).
        return torch.from_numpy(self._base[start:start + nbytes]).view(dtype).reshape(shape)

    def slice_of(self, array: Any) -> Optional[pb.RegionSlice]:
        """The RegionSlice a C-contiguous numpy array, or a contiguous CPU torch tensor, lies in; None when it is
        not (wholly) in this region."""
        if self._map is None:
            return None
        if isinstance(array, np.ndarray):
            if not array.flags.c_contiguous:
                return None
            address, nbytes = array.__array_interface__["data"][0], array.nbytes
        elif _is_torch(array):
            if array.device.type != "cpu" or not array.is_contiguous() or array.numel() == 0:
                return None
            address, nbytes = array.data_ptr(), array.numel() * array.element_size()
        else:
            return None
        start = address - self._mapped_at
        if start < 0 or start + nbytes > self.size:
            return None
        return pb.RegionSlice(region_id=self.id, offset=start, size=nbytes)

    def touch(self) -> None:
        """Faults every page of the region in from this process (writing a zero byte to each; a new region is all
        zeros). Memory of a memfd is charged to the memory cgroup of the process that first touches a page: after
        this, all of it is this process's (the trainer's container's), and none of it is charged to the server's
        when the server writes a result into a page the client had not touched yet."""
        with self._lock:
            if self._base is None:
                raise ValueError("orthoserve: the region is closed")
            self._base[::mmap.PAGESIZE] = 0

    # -- life ------------------------------------------------------------------------------------------------

    def dropped(self) -> bool:
        """Whether the region is known to be gone, without a call: closed here, or its lifeline ended. The server
        ends the lifeline when it drops the region (at once when its process goes, as on a restart; within about a
        second of an UnregisterRegion made elsewhere). False does not promise that the server still has it."""
        lifeline = self._lifeline
        if not self.id or lifeline is None:
            return True
        poller = select.poll()
        try:
            poller.register(lifeline, select.POLLIN | select.POLLPRI)
            # The server sends nothing on a lifeline: anything to read is its end (or a protocol breach, on which
            # the server drops the region too); a hang-up or an error are reported without asking.
            return bool(poller.poll(0))
        except (OSError, ValueError):  # Closed meanwhile (close() in another thread).
            return True

    def close(self, timeout: Optional[float] = None) -> None:
        """Unregisters the region (the server answers once no step uses it any more), closes its lifeline and unmaps
        it here. Arrays still referring to it keep the mapping alive until they are gone. Idempotent. When the
        unregister fails, the lifeline is closed all the same: the server then drops the region on its own."""
        try:
            region_id, self.id = self.id, ""  # Once.
            if region_id:
                unregister(self._stub, self.client.channels, region_id, timeout)
        finally:
            self._release_memory()

    def _release_memory(self) -> None:
        close_lifeline(self)
        with self._lock:
            self._base = None
            if getattr(self, "_map", None) is not None:
                try:
                    self._map.close()
                except BufferError:
                    pass  # Arrays still export it: the mapping goes with the last of them.
                self._map = None
            if getattr(self, "_fd", -1) >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Region(id={self.id or 'closed'}, size={self.size}, address={self.address!r})"


def find_slice(regions: Sequence[Region], array: Any) -> Tuple[Optional[Region], Optional[pb.RegionSlice]]:
    """The region (of `regions`) holding `array`, with its slice; (None, None) when none does."""
    for r in regions:
        s = r.slice_of(array)
        if s is not None:
            return r, s
    return None, None
