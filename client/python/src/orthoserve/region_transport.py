"""How orthoserve.torch sends a lone call's matrices: through a shared-memory region when the server is on this host
and takes regions, else as bytes (issue #28; regions: orthoserve.shm, docs/shared_memory.md).

    transport = RegionTransport("auto")
    [u] = transport.orthogonalize_batch(client, [g], [opts])    # through a region, or bytes
    transport.transport, transport.reason                       # "shm" or "bytes", and why bytes

Modes (`shm=` of orthoserve.torch's Muon and RemoteNewtonSchulz; $ORTHOSERVE_SHM for newton_schulz and as their
default):
  "auto" (default): a region when the server rank the call goes to has a handover socket (ServerInfo.shm_socket),
    that socket exists on this host, and the handover and registration succeed; otherwise bytes, logged once on the
    "orthoserve" logger (INFO) with the reason, which `reason` keeps. A call through the region that fails in any
    way is sent again as bytes (the client's retries and fail-over apply to that), and the region is dropped: the
    next call registers a new one on the rank lone calls then go to.
  "on" (True): always a region; when there can be none, an error saying why (FailedPreconditionError: no socket
    of that rank on this host; the server's refusal; ResourceExhaustedError: no memfd here). A call that fails
    through the region is retried under the client's RetryPolicy through a new region, on another rank when
    there is one (a region the rank forgot, NOT_FOUND, is replaced on that rank at once).
  "off" (False): bytes.

One region per transport (per Muon, per RemoteNewtonSchulz, per client for newton_schulz), sized for the call's
inputs and results (rounded up to 1 MiB) and reused by the next calls; a call that needs more registers a larger one
and unregisters the old. Every page is touched here when the region is made (Region.touch), so all of its memory is
charged to this process's memory cgroup (the trainer's container), none to the server's. Each matrix is copied into
the region (one memcpy, or the device-to-host copy the bytes path makes too), the server reads it and writes its
result there in place, and the result is copied out into a new tensor of the input's dtype and device: the region is
overwritten by the next call, the returned tensors are not. Results are bit for bit those of the bytes path (the
same computation on the same rank).

Why a region is never reused after a failed call: the server may still be running that call's step (a client-side
deadline, a lost connection) and write its results into the region later; they must not land in a later call's
results. A new region is a new memfd, so such late writes go to memory nothing reads.

Group steps (sharded DTensors, tp_group) still send bytes: the server takes regions in group steps and
Group.step(..., out=...) names them, but this transport does not yet keep a region on each member a group step
goes to (docs/shared_memory.md, "Group steps").
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import grpc

from orthoserve import errors, shm

if TYPE_CHECKING:
    from orthoserve.client import Client

__all__ = ["RegionTransport", "shm_mode", "ENV_SHM", "MODES"]

ENV_SHM = "ORTHOSERVE_SHM"
MODES = ("auto", "on", "off")
_ROUND = 1 << 20  # Region sizes are multiples of this.
# After a rank refused a region (or could not take one), auto mode asks it again after this many seconds, so that a
# server without regions costs no extra RPC per call.
_RECHECK_SECONDS = 60.0
# The longest an abandoned region's UnregisterRegion may take (it waits for the server's steps that use it). The
# region is dropped here whatever the answer.
_UNREGISTER_TIMEOUT = 2.0

logger = logging.getLogger("orthoserve")


def shm_mode(value: Any) -> str:
    """The mode ("auto", "on" or "off") for an `shm=` argument: "auto", True / "on", False / "off", or None for
    $ORTHOSERVE_SHM (those words, or 1/0, true/false, yes/no), else "auto". ValueError for anything else."""
    if value is None:
        value = os.environ.get(ENV_SHM, "").strip() or "auto"
    if value is True:
        return "on"
    if value is False:
        return "off"
    word = str(value).strip().lower()
    if word == "auto":
        return "auto"
    if word in ("on", "true", "1", "yes"):
        return "on"
    if word in ("off", "false", "0", "no"):
        return "off"
    raise ValueError(f"orthoserve: shm must be 'auto', True ('on') or False ('off') (also ${ENV_SHM}), got "
                     f"{value!r}")


def _is_local_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _close_quietly(region: "shm.Region") -> None:
    try:
        region.close(timeout=_UNREGISTER_TIMEOUT)
    except Exception:  # noqa: BLE001 - an abandoned region: its memory is released here whatever the server says.
        pass


class _Unavailable(Exception):
    """No region for this call; the message says why (auto mode sends bytes)."""


class RegionTransport:
    """Sends lone calls through a shared-memory region when it can (see the module's docstring). Thread-safe: one
    call uses the region at a time; in auto mode a call that finds it busy sends bytes.

    Attributes:
      mode: "auto", "on" or "off".
      transport: how the last call went: "shm", "bytes", or None before the first call.
      reason: why the last call went as bytes ("" when it went through the region).
      shm_calls, bytes_calls: calls made each way.
      region: the region in use (an orthoserve.shm.Region), or None.
    """

    def __init__(self, shm: Any = "auto", what: str = "orthoserve.torch"):
        self.mode = shm_mode(shm)
        self.what = what
        self.transport: Optional[str] = None
        self.reason = ""
        self.shm_calls = 0
        self.bytes_calls = 0
        self.region: Optional["shm.Region"] = None
        self._client: Optional["Client"] = None
        self._lock = threading.Lock()  # Held by the call using the region.
        self._state_lock = threading.Lock()  # Guards the attributes above.
        self._target = ""  # The rank the last new region was asked of.
        self._refused: Dict[str, Tuple[float, str]] = {}  # Address -> (when, why) it had no region for us.
        self._logged: Optional[Tuple[str, str]] = None  # The last (transport, reason) logged.
        # The region in use, for the finalizer, which unregisters it when the transport goes (or at exit).
        self._held: List[Optional["shm.Region"]] = [None]
        weakref.finalize(self, RegionTransport._drop, self._held)

    # -- the call --------------------------------------------------------------------------------------------

    def orthogonalize_batch(self, client: "Client", tensors: Sequence[Any], options: Sequence[Dict[str, Any]], *,
                            timeout: Optional[float] = None, nd: str = "flatten") -> List[Any]:
        """Client.orthogonalize_batch(tensors, options, timeout=, nd=) of a lone call, through a region or as
        bytes by the mode. Results are new tensors like the inputs. Raises OrthoserveError as that call does, and
        in mode "on" FailedPreconditionError when no region can be had."""
        if self.mode == "off":
            return self._bytes(client, tensors, options, timeout, nd, "shm is off")
        if not self._lock.acquire(blocking=self.mode == "on"):
            return self._bytes(client, tensors, options, timeout, nd,
                               "another call of this transport was using the region", quiet=True)
        try:
            if self.mode == "on":
                return self._required(client, tensors, options, timeout, nd)
            return self._auto(client, tensors, options, timeout, nd)
        finally:
            self._lock.release()

    def _auto(self, client, tensors, options, timeout, nd) -> List[Any]:
        placed, needed = _layout(tensors)
        if needed == 0:
            return self._bytes(client, tensors, options, timeout, nd, "no matrix of this call can be staged")
        try:
            region = self._region_for(client, needed, timeout, avoid=None, required=False)
        except _Unavailable as e:
            return self._bytes(client, tensors, options, timeout, nd, str(e))
        try:
            results = self._through(client, region, tensors, options, placed, timeout, nd, retry=False)
        except errors.OrthoserveError as e:
            why = (f"a call through the region on {region.address} failed ({e.code.name}: {e.message}); it was sent "
                   "again as bytes, and the next call registers a new region")
            self._abandon(region)
            logger.warning("orthoserve: %s: %s", self.what, why)
            return self._bytes(client, tensors, options, timeout, nd, why)
        self._done("shm", "")
        return results

    def _required(self, client, tensors, options, timeout, nd) -> List[Any]:
        placed, needed = _layout(tensors)
        if needed == 0:
            raise ValueError(f"orthoserve: {self.what}: shm=True, but no matrix of this call can be staged in a "
                             "region (empty, or not a torch tensor)")
        attempts = client._attempts(timeout, f"{self.what} through a shared-memory region")
        avoid: Optional[str] = None
        renewed = False  # A region the server no longer knew was replaced once in this call.
        while True:
            region = None
            try:
                t = attempts.timeout()
                region = self._region_for(client, needed, t, avoid=avoid, required=True)
                results = self._through(client, region, tensors, options, placed, t, nd, retry=False)
                self._done("shm", "")
                return results
            except errors.OrthoserveError as e:
                if region is not None:
                    self._abandon(region)
                    if e.code == grpc.StatusCode.NOT_FOUND and not renewed:
                        renewed = True  # The rank forgot the region (it restarted): register anew there.
                        continue
                avoid = region.address if region is not None else self._target
                # Only retryable failures are retried (a rank without regions here is final, at once).
                if not attempts.back_off(e):
                    raise attempts.give_up(e) from None

    # -- the region ------------------------------------------------------------------------------------------

    def _region_for(self, client: "Client", needed: int, timeout: Optional[float], avoid: Optional[str],
                    required: bool) -> "shm.Region":
        """The region to use for a call of `needed` bytes: the current one when it is this client's and large
        enough, else a new one on the rank lone calls go to (not `avoid` while there is another). Auto mode
        (required False): _Unavailable saying why there is none. Mode on: FailedPreconditionError when the rank
        has no socket here, or the error that setting it up raised."""
        with self._state_lock:
            region = self.region
        if region is not None and (self._client is not client or not region.id):
            self._abandon(region)
            region = None
        if region is not None and region.size >= needed:
            return region
        targets = client._lone_targets()
        address = self._target = next((a for a in targets if a != avoid), targets[0])
        if not required:
            refused = self._refused.get(address)
            if refused is not None and time.monotonic() - refused[0] < _RECHECK_SECONDS:
                raise _Unavailable(refused[1])
        size = (needed + _ROUND - 1) // _ROUND * _ROUND
        try:
            info = client._info_once(address, timeout)  # One call: a rank that is down costs no retries here.
            if not info.shm_socket:
                raise errors.FailedPreconditionError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"the server at {address} takes no shared-memory regions (it was not started with --shm-socket)")
            if not _is_local_socket(info.shm_socket):
                raise errors.FailedPreconditionError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"the server at {address} hands regions over on {info.shm_socket}, which is not a socket on "
                    "this host (the server runs elsewhere, or in a container that does not share that path)")
            try:
                new = client.region(size, name=f"{self.what} pid {os.getpid()}", address=address, timeout=timeout)
            except OSError as e:  # memfd_create, ftruncate or mmap here (a limit on memory or descriptors).
                raise errors.ResourceExhaustedError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"a shared-memory region of {size} bytes could not be made here: {e}") from None
            new.touch()  # Charged to this process's memory cgroup, results included (see Region.touch).
        except errors.OrthoserveError as e:
            if region is not None:
                self._abandon(region)
            if required:
                raise
            why = e.message if isinstance(e, errors.FailedPreconditionError) else \
                f"a region of {size} bytes on {address} could not be set up ({e.code.name}: {e.message})"
            self._refused[address] = (time.monotonic(), why)
            raise _Unavailable(why) from None
        if region is not None:
            self._abandon(region)  # Outgrown.
        with self._state_lock:
            self.region = new
            self._client = client
            self._held[0] = new
        self._refused.pop(address, None)
        logger.info("orthoserve: %s: matrices go through a shared-memory region of %d bytes on %s", self.what,
                    size, address)
        return new

    def _abandon(self, region: "shm.Region") -> None:
        """Stops using `region` and unregisters it (bounded; errors ignored: the memory is released here anyway)."""
        with self._state_lock:
            if self.region is region:
                self.region = None
                self._held[0] = None
        _close_quietly(region)

    def close(self) -> None:
        """Unregisters the region, if any. The transport stays usable (a later call registers a new one)."""
        with self._state_lock:
            region = self.region
        if region is not None:
            self._abandon(region)

    @staticmethod
    def _drop(held: List[Optional["shm.Region"]]) -> None:
        if held and held[0] is not None:
            _close_quietly(held[0])

    # -- the two ways ----------------------------------------------------------------------------------------

    def _through(self, client, region, tensors, options, placed, timeout, nd, retry) -> List[Any]:
        """One call (attempts: `retry`) with each placed tensor copied into the region and its result written
        there; returns new tensors (inputs not placed go as bytes in the same call)."""
        inputs: List[Any] = []
        outs: List[Any] = []
        for t, place in zip(tensors, placed):
            if place is None:
                inputs.append(t)
                outs.append(None)
                continue
            at_in, at_out = place
            staged = region.tensor(tuple(t.shape), t.dtype, offset=at_in)
            staged.copy_(t.detach())
            inputs.append(staged)
            outs.append(region.tensor(tuple(t.shape), t.dtype, offset=at_out))
        got = client.orthogonalize_batch(inputs, options, timeout=timeout, nd=nd, out=outs, retry=retry)
        results = []
        for t, o, r in zip(tensors, outs, got):
            if o is None:
                results.append(r)
            elif t.device.type == "cpu":
                results.append(r.clone())
            else:
                results.append(r.to(t.device))
        with self._state_lock:
            self.shm_calls += 1
        return results

    def _bytes(self, client, tensors, options, timeout, nd, why: str, quiet: bool = False) -> List[Any]:
        results = client.orthogonalize_batch(list(tensors), list(options), timeout=timeout, nd=nd)
        with self._state_lock:
            self.bytes_calls += 1
        if not quiet:
            self._done("bytes", why)
        return results

    def _done(self, transport: str, reason: str) -> None:
        with self._state_lock:
            self.transport, self.reason = transport, reason
            changed = self._logged != (transport, reason)
            self._logged = (transport, reason)
        if changed and transport == "bytes":
            logger.info("orthoserve: %s: matrices go as bytes: %s", self.what, reason)

    def __repr__(self) -> str:
        return (f"RegionTransport(mode={self.mode!r}, transport={self.transport!r}, reason={self.reason!r}, "
                f"region={self.region!r})")


def _layout(tensors: Sequence[Any]) -> Tuple[List[Optional[Tuple[int, int]]], int]:
    """Where each tensor's input and result go in a region ((input offset, result offset), or None for one that
    is not staged: not a torch tensor, or empty), and the bytes needed. Every slice starts at a multiple of
    shm.ALIGNMENT."""
    import torch

    placed: List[Optional[Tuple[int, int]]] = []
    end = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or \
                t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            placed.append(None)
            continue
        nbytes = t.numel() * t.element_size()
        at_in = _aligned(end)
        at_out = _aligned(at_in + nbytes)
        end = at_out + nbytes
        placed.append((at_in, at_out))
    return placed, end


def _aligned(offset: int) -> int:
    return (offset + shm.ALIGNMENT - 1) // shm.ALIGNMENT * shm.ALIGNMENT
