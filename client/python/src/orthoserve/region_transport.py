"""How orthoserve.torch sends its matrices: through shared-memory regions when the server rank a call goes to is on
this host and takes regions, else as bytes (issue #28; regions: orthoserve.shm, docs/shared_memory.md). Both lone
calls (whole tensors) and group steps (this trainer rank's blocks of sharded matrices: Muon's sharded DTensors,
newton_schulz's tp_group).

    transport = RegionTransport("auto")
    [u] = transport.orthogonalize_batch(client, [g], [opts])    # a lone call: through a region, or bytes
    [b] = transport.group_step(group, step, [shard])            # a group step: likewise, on the group's member
    transport.transport, transport.reason                       # how the last of them went ("shm", "bytes"); why bytes

Modes (`shm=` of orthoserve.torch's Muon and RemoteNewtonSchulz; $ORTHOSERVE_SHM for newton_schulz and as their
default):
  "auto" (default): a region when the server rank the call goes to has a handover socket (ServerInfo.shm_socket),
    that socket exists on this host, and the handover and registration succeed; otherwise bytes, logged once on the
    "orthoserve" logger (INFO) with the reason, which `reason` keeps. A lone call through the region that fails in
    any way is sent again as bytes (the client's retries and fail-over apply to that), and the region is dropped:
    the next call registers a new one on the rank lone calls then go to. A group step: see "Group steps" below.
  "on" (True): always a region; when there can be none, an error saying why (FailedPreconditionError: no socket
    of that rank on this host; the server's refusal; ResourceExhaustedError: no memfd here). A call that fails
    through the region is retried under the client's RetryPolicy through a new region, on another rank when
    there is one (a lone call's region the rank forgot, NOT_FOUND, is replaced on that rank at once).
  "off" (False): bytes.

Regions: one for lone calls (on the rank they go to) and one for each member that group steps go to (Group.address:
the groups of one trainer rank may be routed to different members), per transport (per Muon, per RemoteNewtonSchulz,
per client for newton_schulz). Each is sized for a call's inputs and results (rounded up to 1 MiB) and reused by the
next calls; a call that needs more registers a larger one and unregisters the old. Every page is touched here when
the region is made (Region.touch), so all of its memory is charged to this process's memory cgroup (the trainer's
container), none to the server's. Each matrix (block) is copied into the region (one memcpy, or the device-to-host
copy the bytes path makes too), the server reads it and writes its result there in place, and the result is copied
out into a new tensor of the input's dtype and device: the region is overwritten by the next call, the returned
tensors are not. Results are bit for bit those of the bytes path (the same computation on the same rank).

Why a region is never reused after a failed call: the server may still be running that call's step (a client-side
deadline, a lost connection) and write its results into the region later; they must not land in a later call's
results. A new region is a new memfd, so such late writes go to memory nothing reads. That is why its calls are not
fenced (orthoserve.fences; `fence=False`): a failed attempt through a region is reported at once, even when the region's
server cannot be reached, and the next attempt goes through a new region or as bytes.

Group steps. A group step must be the same step on every attempt: the fleet digests each rank's blocks, answers a
retry (StepHeader.attempt > 0) of a step that ran from the other ranks' kept inputs only when its blocks are the first
attempt's, and takes a report whose attempt number is not above the one it holds for that rank as a duplicate rank,
which fails the step on every rank (docs/architecture.md, "Replays"). So all attempts of one step are numbered by one
Attempts sequence (Group.new_attempts, with one retry deadline), whichever way each goes. The first goes through the
region on the member the rank is routed to (and is pinned there). When it fails in a way the client retries
(UNAVAILABLE, a fleet change, the attempt's own timeout), the region is dropped and
  auto sends the same blocks as bytes in the next attempts of that sequence (Group.send_attempts: attempt 1, 2, ...,
    re-routed away from the member that failed, as every bytes retry is): a retry the fleet replaces the region
    attempt's report with, or answers by a replay, like any other retry;
  on sends attempt 1, 2, ... each through a new region on the member the re-read membership routes the rank to.
A failure the client does not retry is the step's failure on every rank of the group (the server fails the whole
group step, and the other ranks get ABORTED), so resending this rank's blocks could only wait for ranks that never
come: it is raised, as it is for bytes, the region dropped, and the next step registers a new one. That includes
NOT_FOUND, a region the member no longer has; because it costs the whole group its step, a group step's region is
first checked without a call (Region.dropped: the member ends a region's lifeline when it drops it, at once when the
member's process goes) and replaced when gone. (A lone call through a forgotten region fails alone, and is sent again.)
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc

from orthoserve import errors, layout, shm

if TYPE_CHECKING:
    from orthoserve.client import Client, Group

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
_LONE = ""  # The key of the lone calls' region among a transport's regions (a group step's: its member's address).

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
    """Sends lone calls and group steps through shared-memory regions when it can (see the module's docstring).
    Thread-safe: one lone call uses the lone region at a time, and one group step the group regions; in auto mode
    a call that finds them busy sends bytes.

    Attributes:
      mode: "auto", "on" or "off".
      transport: how the last call (lone call or group step) went: "shm", "bytes", or None before the first.
      reason: why the last call went as bytes ("" when it went through a region).
      shm_calls, bytes_calls: calls (lone calls and group steps) made each way.
      region: the lone calls' region (an orthoserve.shm.Region), or None.
      group_regions: the group steps' regions by member address (a copy).
    """

    def __init__(self, shm: Any = "auto", what: str = "orthoserve.torch"):
        self.mode = shm_mode(shm)
        self.what = what
        self.transport: Optional[str] = None
        self.reason = ""
        self.shm_calls = 0
        self.bytes_calls = 0
        self._lock = threading.Lock()  # Held by the lone call using the lone region.
        self._group_lock = threading.Lock()  # Held by the group step using the group regions.
        self._state_lock = threading.Lock()  # Guards the attributes above and _regions.
        self._target = ""  # The rank the last new lone region was asked of.
        self._refused: Dict[str, Tuple[float, str]] = {}  # Address -> (when, why) it had no region for us.
        self._logged: Optional[Tuple[str, str]] = None  # The last (transport, reason) logged.
        # The regions in use (_LONE: the lone calls'; a member's address: its group steps'). The finalizer
        # unregisters them when the transport goes (or at exit).
        self._regions: Dict[str, "shm.Region"] = {}
        weakref.finalize(self, RegionTransport._drop, self._regions)

    @property
    def region(self) -> Optional["shm.Region"]:
        with self._state_lock:
            return self._regions.get(_LONE)

    @property
    def group_regions(self) -> Dict[str, "shm.Region"]:
        with self._state_lock:
            return {k: r for k, r in self._regions.items() if k != _LONE}

    def _by_mode(self, lock: threading.Lock, tensors: Sequence[Any], send_bytes: Callable[..., List[Any]],
                 auto: Callable[..., List[Any]], required: Callable[..., List[Any]]) -> List[Any]:
        """A call of `tensors` by the mode: send_bytes(why, quiet=False) for bytes, else auto(placed, needed) or
        required(placed, needed) (their layout in a region, _layout) holding `lock`."""
        if self.mode == "off":
            return send_bytes("shm is off")
        if not lock.acquire(blocking=self.mode == "on"):
            return send_bytes("another call of this transport was using its region", quiet=True)
        try:
            placed, needed = _layout(tensors)
            if needed == 0 and self.mode == "on":
                raise ValueError(f"orthoserve: {self.what}: shm=True, but no matrix of this call can be staged in a "
                                 "region (empty, or not a torch tensor)")
            if needed == 0:
                return send_bytes("no matrix of this call can be staged")
            return (required if self.mode == "on" else auto)(placed, needed)
        finally:
            lock.release()

    # -- lone calls ------------------------------------------------------------------------------------------

    def orthogonalize_batch(self, client: "Client", tensors: Sequence[Any], options: Sequence[Dict[str, Any]], *,
                            timeout: Optional[float] = None, nd: str = "flatten") -> List[Any]:
        """Client.orthogonalize_batch(tensors, options, timeout=, nd=) of a lone call, through a region or as
        bytes by the mode. Results are new tensors like the inputs. Raises OrthoserveError as that call does, and
        in mode "on" FailedPreconditionError when no region can be had."""
        def send_bytes(why: str, quiet: bool = False) -> List[Any]:
            return self._bytes(client, tensors, options, timeout, nd, why, quiet)

        return self._by_mode(self._lock, tensors, send_bytes,
                             lambda placed, needed: self._auto(client, tensors, options, placed, needed, timeout, nd),
                             lambda placed, needed: self._required(client, tensors, options, placed, needed, timeout,
                                                                   nd))

    def _auto(self, client, tensors, options, placed, needed, timeout, nd) -> List[Any]:
        try:
            region = self._region_for(client, needed, timeout, avoid=None, required=False)
        except _Unavailable as e:
            return self._bytes(client, tensors, options, timeout, nd, str(e))
        try:
            results = self._through(client, region, tensors, options, placed, timeout, nd)
        except errors.OrthoserveError as e:
            self._abandon(region)
            why = self._failure(region, e, "a call", "it was sent again as bytes, and the next call registers a new "
                                                     "region")
            return self._bytes(client, tensors, options, timeout, nd, why)
        self._done("shm", "")
        return results

    def _required(self, client, tensors, options, placed, needed, timeout, nd) -> List[Any]:
        attempts = client.new_attempts(timeout, f"{self.what} through a shared-memory region")
        avoid: Optional[str] = None
        renewed = False  # A region the server no longer knew was replaced once in this call.
        while True:
            region = None
            try:
                t = attempts.timeout()
                region = self._region_for(client, needed, t, avoid=avoid, required=True)
                results = self._through(client, region, tensors, options, placed, t, nd)
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

    # -- group steps -----------------------------------------------------------------------------------------

    def group_step(self, group: "Group", step: int, shards: Sequence[layout.Shard], *,
                   timeout: Optional[float] = None) -> List[Any]:
        """group.step(step, shards, timeout=) of this trainer rank, through a region on the member the step goes
        to or as bytes by the mode; every attempt is numbered by one Attempts sequence (the module's "Group steps").
        Results are new tensors like the shards' data. Raises OrthoserveError as Group.step does, and in mode "on"
        FailedPreconditionError when no region can be had."""
        if not shards:
            return []
        attempts = group.new_attempts(step, timeout)

        def send_bytes(why: str, quiet: bool = False) -> List[Any]:
            return self._group_bytes(group, step, shards, attempts, "", why, quiet)

        return self._by_mode(self._group_lock, [s.data for s in shards], send_bytes,
                             lambda placed, needed: self._group_auto(group, step, shards, placed, needed, attempts),
                             lambda placed, needed: self._group_required(group, step, shards, placed, needed,
                                                                         attempts))

    def _group_auto(self, group, step, shards, placed, needed, attempts) -> List[Any]:
        try:
            region = self._group_region(group.client, group.address, needed, attempts.timeout(), required=False)
        except _Unavailable as e:
            return self._group_bytes(group, step, shards, attempts, "", str(e))
        try:
            results = self._group_through(group, step, shards, placed, region, attempts)
        except errors.OrthoserveError as e:
            self._abandon(region)
            # Not retried (a final code, or no retry left): the step failed on every rank of the group, as bytes.
            if not attempts.back_off(e):
                raise attempts.give_up(e) from None
            why = self._failure(region, e, "a group step", f"it was sent again as bytes (attempt {attempts.number}),"
                                                           " and the next step registers a new region")
            return self._group_bytes(group, step, shards, attempts, region.address, why)
        self._done("shm", "")
        return results

    def _group_required(self, group, step, shards, placed, needed, attempts) -> List[Any]:
        failed = ""  # The member the previous attempt failed on.
        while True:
            address, region = failed, None
            try:
                address = group.route(attempts, failed)
                region = self._group_region(group.client, address, needed, attempts.timeout(), required=True)
                results = self._group_through(group, step, shards, placed, region, attempts)
                self._done("shm", "")
                return results
            except errors.OrthoserveError as e:
                if region is not None:
                    self._abandon(region)
                # Only retryable failures are retried, through a new region on the member the retry is routed to.
                if not attempts.back_off(e):
                    raise attempts.give_up(e) from None
                failed = address

    def _group_through(self, group, step, shards, placed, region, attempts) -> List[Any]:
        """One attempt of the step (numbered attempts.number) with each placed block copied into `region` and its
        result written there, pinned to the region's member; returns new tensors (blocks not placed go as bytes in
        the same attempt)."""
        data = [s.data for s in shards]
        inputs, outs = _stage(region, data, placed)
        staged = [_with_data(s, x) for s, x in zip(shards, inputs)]
        # Not fenced: a region that a failed attempt used is never used again (see "Why a region is never reused").
        got = group.send(step, staged, region.address, attempts, out=outs, fence=False)
        return self._copied_out(data, outs, got)

    def _group_bytes(self, group, step, shards, attempts, failed: str, why: str, quiet: bool = False) -> List[Any]:
        """The step as bytes, in the attempts of `attempts` from its current number on (after a failed attempt
        through a region: re-routed away from `failed`, its member)."""
        results = group.send_attempts(step, shards, attempts, failed)
        self._count_bytes(why, quiet)
        return results

    # -- the regions -----------------------------------------------------------------------------------------

    def _current(self, key: str, client: "Client") -> Optional["shm.Region"]:
        """The region kept under `key` when it is this client's and still registered (else it is dropped)."""
        with self._state_lock:
            region = self._regions.get(key)
        if region is not None and (region.client is not client or not region.id):
            self._abandon(region)
            return None
        return region

    def _region_for(self, client: "Client", needed: int, timeout: Optional[float], avoid: Optional[str],
                    required: bool) -> "shm.Region":
        """The region for a lone call of `needed` bytes: the current one when it is this client's and large
        enough, else a new one on the rank lone calls go to (not `avoid` while there is another); see _register."""
        region = self._current(_LONE, client)
        if region is not None and region.size >= needed:
            return region
        targets = client.lone_targets()
        address = self._target = next((a for a in targets if a != avoid), targets[0])
        return self._register(_LONE, region, client, address, needed, timeout, required)

    def _group_region(self, client: "Client", address: str, needed: int, timeout: Optional[float],
                      required: bool) -> "shm.Region":
        """The region for a group step of `needed` bytes to member `address`: the one on that member when it is
        large enough, else a new one there; see _register. Group regions their member dropped are let go first
        (a NOT_FOUND would fail the step on every rank; and a member that left keeps none of our memory)."""
        for member, region in self.group_regions.items():
            if region.dropped():
                logger.info("orthoserve: %s: the member %s dropped the region of its group steps (it restarted or "
                            "left, or the region was unregistered)", self.what, member)
                self._abandon(region)
        region = self._current(address, client)
        if region is not None and region.size >= needed:
            return region
        return self._register(address, region, client, address, needed, timeout, required)

    def _register(self, key: str, old: Optional["shm.Region"], client: "Client", address: str, needed: int,
                  timeout: Optional[float], required: bool) -> "shm.Region":
        """A new region of at least `needed` bytes on `address`, kept under `key` in place of `old` (outgrown, or
        None). Auto mode (required False): _Unavailable saying why there is none. Mode on: FailedPreconditionError
        when the rank has no socket here, or the error that setting it up raised."""
        if not required:
            refused = self._refused.get(address)
            if refused is not None and time.monotonic() - refused[0] < _RECHECK_SECONDS:
                raise _Unavailable(refused[1])
        size = (needed + _ROUND - 1) // _ROUND * _ROUND
        try:
            info = client.info_once(address, timeout)  # One call: a rank that is down costs no retries here.
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
            if old is not None:
                self._abandon(old)
            if required:
                raise
            why = e.message if isinstance(e, errors.FailedPreconditionError) else \
                f"a region of {size} bytes on {address} could not be set up ({e.code.name}: {e.message})"
            self._refused[address] = (time.monotonic(), why)
            raise _Unavailable(why) from None
        if old is not None:
            self._abandon(old)  # Outgrown.
        with self._state_lock:
            self._regions[key] = new
        self._refused.pop(address, None)
        logger.info("orthoserve: %s: %s go through a shared-memory region of %d bytes on %s", self.what,
                    "matrices" if key == _LONE else "group steps' blocks", size, address)
        return new

    def _abandon(self, region: "shm.Region") -> None:
        """Stops using `region` and unregisters it (bounded; errors ignored: the memory is released here anyway)."""
        with self._state_lock:
            for key in [k for k, r in self._regions.items() if r is region]:
                del self._regions[key]
        _close_quietly(region)

    def _failure(self, region: "shm.Region", error: errors.OrthoserveError, call: str, then: str) -> str:
        """Says (a warning) that `call` through `region` failed with `error`, and `then` what follows: the reason
        of the bytes that follow."""
        why = f"{call} through the region on {region.address} failed ({error.code.name}: {error.message}); {then}"
        logger.warning("orthoserve: %s: %s", self.what, why)
        return why

    def close(self) -> None:
        """Unregisters the regions, if any. The transport stays usable (a later call registers new ones)."""
        with self._state_lock:
            regions = list(self._regions.values())
        for region in regions:
            self._abandon(region)

    @staticmethod
    def _drop(regions: Dict[str, "shm.Region"]) -> None:
        for region in list(regions.values()):
            _close_quietly(region)

    # -- the two ways ----------------------------------------------------------------------------------------

    def _through(self, client, region, tensors, options, placed, timeout, nd) -> List[Any]:
        """One attempt (no retries) with each placed tensor copied into the region and its result written there;
        returns new tensors (inputs not placed go as bytes in the same call)."""
        inputs, outs = _stage(region, tensors, placed)
        # Not fenced: a region that a failed call used is never used again (see "Why a region is never reused").
        got = client.orthogonalize_batch(inputs, options, timeout=timeout, nd=nd, out=outs, retry=False, fence=False)
        return self._copied_out(tensors, outs, got)

    def _copied_out(self, tensors: Sequence[Any], outs: Sequence[Any], got: Sequence[Any]) -> List[Any]:
        """The results `got` of a call through a region, those in the region (`outs`) copied into new tensors of
        their input's device; counts the call."""
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
        self._count_bytes(why, quiet)
        return results

    def _count_bytes(self, why: str, quiet: bool) -> None:
        with self._state_lock:
            self.bytes_calls += 1
        if not quiet:
            self._done("bytes", why)

    def _done(self, transport: str, reason: str) -> None:
        with self._state_lock:
            self.transport, self.reason = transport, reason
            changed = self._logged != (transport, reason)
            self._logged = (transport, reason)
        if changed and transport == "bytes":
            logger.info("orthoserve: %s: matrices go as bytes: %s", self.what, reason)

    def __repr__(self) -> str:
        return (f"RegionTransport(mode={self.mode!r}, transport={self.transport!r}, reason={self.reason!r}, "
                f"region={self.region!r}, group_regions={self.group_regions!r})")


def _stage(region: "shm.Region", tensors: Sequence[Any], placed: Sequence[Optional[Tuple[int, int]]]
           ) -> Tuple[List[Any], List[Any]]:
    """The inputs of a call through `region` (each placed tensor copied into it; the others as they are) and its
    out tensors (a region tensor for each placed one's result, None for the others)."""
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
    return inputs, outs


def _with_data(shard: layout.Shard, data: Any) -> layout.Shard:
    """`shard` with `data` (the same values, e.g. in a region) in place of its own."""
    if data is shard.data:
        return shard
    return layout.Shard(shard.name, shard.global_shape, shard.offset, data, algorithm=shard.algorithm,
                        partition_dim=shard.partition_dim, nd=shard.nd, **shard.options)


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
