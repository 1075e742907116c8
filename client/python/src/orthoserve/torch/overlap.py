"""Muon's orthogonalization overlapped with backward, for plain (non-DTensor) parameters (issue #41, item 1).

    overlap = Overlap(OverlapOptions(), compute=opt._early_update, send=opt._send_early)
    overlap.watch(params)               # a post-accumulate-grad hook on each parameter
    loss.backward()                     # each hook: compute(p) -> p's update, into the open bucket; a full bucket
                                        # is sent on a background thread; the end of backward sends the last one
    early = overlap.claim(p, now)       # at step(): p's early update, if what it was computed from is unchanged
    out = overlap.result(early)         # its orthogonalized update (waits), or None: the send failed
    overlap.discard()                   # whatever the step did not claim is stale

The contract (Muon.step relies on it): nothing here writes a parameter, a gradient or optimizer state. A hook reads p,
p.grad and p's momentum buffer and computes p's update into new tensors (compute(p): the same function the synchronous
step calls, orthoserve.torch.muon_update), recording what it read (muon_update.Inputs: the tensors, their version
counters, the settings and NS options). The step claims an early update only when the same look now gives the same
Inputs, so a gradient changed after it was sent (accumulation over micro-batches, clip_grad_norm_, zero_grad, a
closure or a second backward, a changed momentum or NS setting) is never used: the step recomputes it and sends it
with its synchronous call. An early send that fails for any reason (the server down after the client's retries, an
error answer) makes result() return None, and the step sends that update again synchronously: under the client's
retry policy and Muon's `fallback`, raising as a synchronous step does (and then changing nothing). Early sends never
fall back to a local computation.

A hook never raises into backward: a failure to compute an update early is logged once and left to the step. Hooks
skip DTensor parameters (never watched) and every parameter while torch.distributed is initialized (DDP's reducer
writes the averaged gradient after the hook: see Muon's docstring), while the optimizer is inside no_overlap(), and
while they rest after steps that used none of their early updates (end_step, _MAX_IDLE_STEPS).

Threads: hooks run on autograd's threads (the caller's for CPU tensors), sends on a small pool of `in_flight`
threads (more full buckets wait for one), claim/result/discard on the step's thread; the state they share is guarded
by one lock. CUDA tensors: a hook records an event after the kernels computing its update, on its stream, and the
send thread waits for that event before it copies the update to the host, and for its own stream after it copied the
results to the device, so the step reads finished results on any stream; only the send thread blocks (the copies
themselves are the client's ordinary .cpu() and .to(device): pinned staging and side streams are issue #41 item 4).

Ownership: the hooks hold this object weakly and it holds the optimizer's methods weakly (weakref.WeakMethod), so a
model never keeps its optimizer alive; when this object goes (with its optimizer), a finalizer removes the hooks and
stops the pool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from orthoserve.torch.dtensors import is_dtensor
from orthoserve.torch.muon_update import Inputs

__all__ = ["Overlap", "OverlapOptions", "OverlapStats", "overlap_options", "ENV_OVERLAP", "DEFAULT_BUCKET_BYTES",
           "DEFAULT_IN_FLIGHT"]

ENV_OVERLAP = "ORTHOSERVE_OVERLAP"
# Small buckets, unlike DDP's 25 MiB: the work behind a bucket is Newton–Schulz (milliseconds per MiB), not a
# bandwidth-bound all-reduce, and the last bucket of a backward can only start when backward ends.
DEFAULT_BUCKET_BYTES = 1 << 20
DEFAULT_IN_FLIGHT = 2
# A step that has waited this long for an early send logs what it waits for (and goes on waiting: every call has the
# client's deadlines).
_STALL_LOG_SECONDS = 30.0
# After a step that used none of its early updates and found some stale (a loop that changes every gradient after
# backward, e.g. clip_grad_norm_, or a momentum schedule set between backward and step), the hooks rest for 1 step,
# then (if the next try is voided too) 2, 4, ... up to this many, before they try again; a step that uses an early
# result ends the rest. The numbers never depend on it: it spares the trainer and the fleet the voided work.
_MAX_IDLE_STEPS = 64

logger = logging.getLogger("orthoserve")

# (inputs, new gradient or None, new momentum buffer, update, NS options) of one parameter: Muon's _early_update.
Made = Tuple[Inputs, Optional[torch.Tensor], torch.Tensor, torch.Tensor, Dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class OverlapOptions:
    """How Muon overlaps its orthogonalization with backward (`overlap=` of orthoserve.torch.Muon)."""

    bucket_bytes: int = DEFAULT_BUCKET_BYTES  # A bucket is sent once its updates hold at least this many bytes.
    in_flight: int = DEFAULT_IN_FLIGHT  # Buckets sent at once (each on its own thread, one client call); more wait.

    def __post_init__(self) -> None:
        if not (isinstance(self.bucket_bytes, int) and self.bucket_bytes > 0):
            raise ValueError(f"OverlapOptions: bucket_bytes must be an int > 0, got {self.bucket_bytes!r}")
        if not (isinstance(self.in_flight, int) and self.in_flight > 0):
            raise ValueError(f"OverlapOptions: in_flight must be an int > 0, got {self.in_flight!r}")


def overlap_options(value: Any) -> Optional[OverlapOptions]:
    """The options for an `overlap=` argument, None for no overlap: True (the defaults), False, an OverlapOptions, or
    None for $ORTHOSERVE_OVERLAP (1/on/true/yes, 0/off/false/no; unset: on). ValueError or TypeError otherwise."""
    if value is None:
        word = os.environ.get(ENV_OVERLAP, "").strip().lower()
        if word in ("", "1", "on", "true", "yes"):
            return OverlapOptions()
        if word in ("0", "off", "false", "no"):
            return None
        raise ValueError(f"orthoserve: ${ENV_OVERLAP} must be 1/on/true/yes or 0/off/false/no, got {word!r}")
    if value is True:
        return OverlapOptions()
    if value is False:
        return None
    if isinstance(value, OverlapOptions):
        return value
    raise TypeError(f"Muon: overlap must be True, False, None or an OverlapOptions, got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class OverlapStats:
    """Counts since the optimizer was made (Muon.overlap_stats: a snapshot)."""

    computed: int = 0  # Updates computed by the hooks during backward (a parameter once per backward).
    buckets: int = 0  # Buckets sent (one client call each).
    used: int = 0  # Early results that steps applied.
    stale: int = 0  # Early updates a step did not use: what they were computed from had changed, or no step took them.
    superseded: int = 0  # Early updates replaced by a later backward's before a step (e.g. accumulation).
    failed: int = 0  # Early updates whose send failed: their steps sent them again synchronously.
    idle_steps: int = 0  # Steps whose backward computed nothing early (a loop that voids every early update).


class _Bucket:
    """Early updates sent in one call; `future` ends when the call did (its exception, if it failed)."""

    def __init__(self, entries: List["Early"]):
        self.entries = entries
        self.future: Future = Future()
        self.sent_at = time.monotonic()
        self.reported = False  # Its failure was logged.


class Early:
    """One parameter's update computed by its hook (muon_update.momentum_update) and what it was computed from; `out`,
    its orthogonalized update, is set by the send of its bucket."""

    __slots__ = ("p", "inputs", "new_grad", "new_buf", "update", "options", "bucket", "superseded", "out", "ready")

    def __init__(self, p: torch.Tensor, made: Made):
        self.p = p
        self.inputs, self.new_grad, self.new_buf, self.update, self.options = made
        self.bucket: Optional[_Bucket] = None
        self.superseded = False
        self.out: Optional[torch.Tensor] = None
        # A CUDA update: an event after the kernels that compute it, on the hook's stream (the send waits for it).
        self.ready: Optional[Any] = None
        if self.update.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record(torch.cuda.current_stream(self.update.device))

    @property
    def nbytes(self) -> int:
        return self.update.numel() * self.update.element_size()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _hook(ref: "weakref.ReferenceType[Overlap]", p: torch.Tensor) -> None:
    overlap = ref()
    if overlap is not None:
        overlap.on_grad(p)


def _end_of_backward(ref: "weakref.ReferenceType[Overlap]") -> None:
    overlap = ref()
    if overlap is not None:
        overlap.flush()


def _send_bucket(send_ref: "weakref.WeakMethod", bucket: _Bucket) -> None:
    """Runs on a pool thread: sends the bucket's live (not superseded) updates in one call; ends its future."""
    if not bucket.future.set_running_or_notify_cancel():
        return
    try:
        live = [e for e in bucket.entries if not e.superseded]
        send = send_ref()
        if send is None:
            raise RuntimeError("the optimizer is gone")
        if live:
            for e in live:
                if e.ready is not None:
                    e.ready.synchronize()  # This thread reads the update on its own stream.
            outs = send([e.p for e in live], [e.update for e in live], [e.options for e in live])
            for device in {o.device for o in outs if o.is_cuda}:
                torch.cuda.current_stream(device).synchronize()  # The results' copies to the device are done.
            for e, o in zip(live, outs):
                e.out = o
        bucket.future.set_result(None)
    except BaseException as e:  # noqa: BLE001 - handed to the step, which sends these updates again.
        bucket.future.set_exception(e)


def _close(handles: List[Any], pool: List[ThreadPoolExecutor]) -> None:
    for h in handles:
        h.remove()
    handles.clear()
    for executor in pool:
        executor.shutdown(wait=False)
    pool.clear()


class Overlap:
    """The hooks, buckets and early sends of one optimizer (the module's docstring).

    compute(p) -> Made or None (None: leave p to the step) and send(params, updates, options) -> orthogonalized
    updates are the optimizer's bound methods, held weakly. `what` names the optimizer in log lines."""

    def __init__(self, options: OverlapOptions, compute: Callable[[torch.Tensor], Optional[Made]],
                 send: Callable[[List[torch.Tensor], List[torch.Tensor], List[Dict[str, Any]]], List[torch.Tensor]],
                 what: str = "Muon"):
        self.options = options
        self.what = what
        self._compute = weakref.WeakMethod(compute)
        self._send = weakref.WeakMethod(send)
        self._lock = threading.Lock()
        self._early: Dict[int, Early] = {}  # By id(p) (the Early holds p). Guarded by _lock.
        self._open: List[Early] = []  # The bucket being filled. Guarded by _lock.
        self._open_bytes = 0  # Guarded by _lock.
        self._flush_queued = False  # An end-of-backward flush is queued with autograd. Guarded by _lock.
        self._can_queue = True  # autograd's queue_callback works here (else the step flushes).
        self._paused = 0  # Depth of no_overlap(). Guarded by _lock.
        self._idle_left = 0  # Steps the hooks still rest for (_MAX_IDLE_STEPS). Guarded by _lock.
        self._idle_next = 1  # How long the next rest is. Guarded by _lock.
        self._at_step = OverlapStats()  # The counts when the last step ended. Guarded by _lock.
        self._counts = OverlapStats()  # Guarded by _lock.
        self._warned = False
        self._handles: List[Any] = []
        self._pool: List[ThreadPoolExecutor] = []  # The send threads, made on the first send.
        weakref.finalize(self, _close, self._handles, self._pool)

    # -- hooks -----------------------------------------------------------------------------------------------

    def watch(self, params: Iterable[torch.Tensor]) -> None:
        """Hooks each plain parameter that requires grad now (DTensors, and a parameter made to require grad later,
        keep the synchronous path)."""
        ref = weakref.ref(self)
        for p in params:
            if is_dtensor(p) or not p.requires_grad:
                continue
            self._handles.append(p.register_post_accumulate_grad_hook(functools.partial(_hook, ref)))

    def on_grad(self, p: torch.Tensor) -> None:
        """p's gradient is accumulated (autograd's thread): p's update into the open bucket, a full bucket sent."""
        with self._lock:
            if self._paused or self._idle_left:
                return
        if _distributed():
            return
        try:
            compute = self._compute()
            made = compute(p) if compute is not None else None
        except Exception as e:  # noqa: BLE001 - never into backward; the step computes p and raises if it must.
            made = None
            if not self._warned:
                self._warned = True
                logger.warning("orthoserve: %s: computing an update during backward failed (%s: %s); such updates "
                               "are computed by step()", self.what, type(e).__name__, e)
        early = Early(p, made) if made is not None else None
        full: List[Early] = []
        with self._lock:
            old = self._early.pop(id(p), None)
            if old is not None:
                old.superseded = True
                self._count(superseded=1)
            if early is None:
                return
            self._early[id(p)] = early
            self._open.append(early)
            self._open_bytes += early.nbytes
            self._count(computed=1)
            if self._open_bytes >= self.options.bucket_bytes:
                full = self._take_open_locked()
            queue = self._can_queue and not self._flush_queued
            self._flush_queued = self._flush_queued or queue
        if full:
            self._submit(full)
        if queue:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(  # type: ignore[attr-defined]
                    functools.partial(_end_of_backward, weakref.ref(self)))
            except Exception:  # noqa: BLE001 - no end-of-backward callback here: step() sends the last bucket.
                with self._lock:
                    self._can_queue = self._flush_queued = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Within: hooks compute and send nothing (the step computes those parameters itself)."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    # -- sending ---------------------------------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        """Adds to the counts; call holding _lock."""
        self._counts = dataclasses.replace(
            self._counts, **{k: getattr(self._counts, k) + v for k, v in deltas.items()})

    def _take_open_locked(self) -> List[Early]:
        entries, self._open, self._open_bytes = self._open, [], 0
        return entries

    def _submit(self, entries: List[Early]) -> None:
        bucket = _Bucket(entries)
        with self._lock:
            for e in entries:
                e.bucket = bucket
            self._count(buckets=1)
            if not self._pool:
                self._pool.append(ThreadPoolExecutor(max_workers=self.options.in_flight,
                                                     thread_name_prefix="orthoserve-overlap"))
            pool = self._pool[0]
        pool.submit(_send_bucket, self._send, bucket)

    def flush(self) -> None:
        """Sends the open bucket (the end of backward; step() too, in case no callback ran)."""
        with self._lock:
            entries = self._take_open_locked()
            self._flush_queued = False
        if entries:
            self._submit(entries)

    # -- the step --------------------------------------------------------------------------------------------

    def claim(self, p: torch.Tensor, now: Callable[[], Inputs]) -> Optional[Early]:
        """p's early update when there is one and now() (what the step would compute p's update from) matches what
        it was computed from; None otherwise (counted stale). Call after flush()."""
        with self._lock:
            early = self._early.pop(id(p), None)
        if early is None:
            return None
        if early.bucket is not None and early.inputs.matches(now()):
            return early
        early.superseded = True  # Not sent yet: it will not be.
        with self._lock:
            self._count(stale=1)
        return None

    def result(self, early: Early) -> Optional[torch.Tensor]:
        """early's orthogonalized update once its bucket's call ended (waits for it); None when that call failed
        (logged once per bucket): the step sends the update again."""
        bucket = early.bucket
        assert bucket is not None
        while True:
            try:
                # The send's own exception, returned (an interrupt of this wait propagates as usual).
                error = bucket.future.exception(timeout=_STALL_LOG_SECONDS)
                break
            except TimeoutError:
                logger.warning("orthoserve: %s step waits for %d updates sent %.0f s ago during backward", self.what,
                               len(bucket.entries), time.monotonic() - bucket.sent_at)
        if error is not None:
            with self._lock:
                self._count(failed=1)
                report, bucket.reported = not bucket.reported, True
            if report:
                logger.warning("orthoserve: %s: %d updates sent during backward failed (%s: %s); the step sends "
                               "them again", self.what, len(bucket.entries), type(error).__name__, error)
            return None
        with self._lock:
            self._count(used=1)
        return early.out

    def discard(self) -> None:
        """Drops the early updates no step claimed (parameters without a gradient at the step); counted stale."""
        with self._lock:
            stale, self._early = self._early, {}
            self._count(stale=len(stale))
        for early in stale.values():
            early.superseded = True  # Not sent yet: it will not be.

    def end_step(self) -> None:
        """The end of a step (whether it succeeded or raised): counts a resting step, or starts a rest when the step
        used none of its early updates and found some stale (_MAX_IDLE_STEPS)."""
        with self._lock:
            used = self._counts.used - self._at_step.used
            stale = self._counts.stale - self._at_step.stale
            if self._idle_left:
                self._idle_left -= 1
                self._count(idle_steps=1)
            elif used == 0 and stale > 0:
                self._idle_left, self._idle_next = self._idle_next, min(2 * self._idle_next, _MAX_IDLE_STEPS)
            elif used > 0:
                self._idle_next = 1
            self._at_step = self._counts

    @property
    def stats(self) -> OverlapStats:
        with self._lock:
            return self._counts

    def close(self) -> None:
        """Removes the hooks and stops the send threads (sends under way end on their own)."""
        _close(self._handles, self._pool)
