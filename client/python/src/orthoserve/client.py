"""The orthoserve client: whole matrices of a lone client, and group steps of sharded matrices (the service and
its messages: proto/orthoserve/v1/orthogonalizer.proto; group steps and algorithms: docs/architecture.md).

A Client holds one gRPC channel per server address; it is safe to share between threads (gRPC channels are),
and a Group may be used by one thread at a time. Calls retry retryable failures under the client's RetryPolicy
(orthoserve.retry). A group step carries its run's id (StepHeader.run_id; orthoserve.runs).

No call waits forever by default: each attempt has a deadline (DEFAULT_TIMEOUT), an attempt that runs out of it is
retried on another address or member while the retry deadline allows, and every channel sends HTTP/2 keepalive pings
while it has calls in flight, so a peer that vanished without closing its connection is noticed (see
DEFAULT_KEEPALIVE_TIME).

Every result is checked against what this rank sent before its data is returned: MatrixResult.index in range and
not repeated, and name, global shape, N-d layout and block equal to the spec sent at that index (for a whole matrix
the block is its whole 2-D view). A mismatch raises orthoserve.IntegrityError and returns nothing.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc

from orthoserve import (arrays, calls, channels as channels_lib, errors, fences, layout, options as options_lib,
                        region_slices, retry as retry_lib, routing, runs, shm)
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc
from orthoserve.channels import DEFAULT_KEEPALIVE_TIME, DEFAULT_KEEPALIVE_TIMEOUT
from orthoserve.entries import Entry

__all__ = ["Client", "Group", "DEFAULT_CHUNK_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_KEEPALIVE_TIME",
           "DEFAULT_KEEPALIVE_TIMEOUT", "ND_MODES"]

DEFAULT_CHUNK_BYTES = 4 << 20
# Seconds each attempt of a call may take unless the caller says otherwise. Longer than the service's default
# rendezvous timeout (60 s), so that a group step whose other trainer ranks never come ends with the server's ABORTED
# naming them rather than with a client timeout; shorter than the retry deadline (120 s), so that an attempt stuck on
# a stalled member leaves time for a retry elsewhere.
DEFAULT_TIMEOUT = 90.0
# How N-d (>= 3 dims) arrays are read as matrices (MatrixSpec.nd_layout): "flatten" as one shape[0] x prod(rest)
# matrix (the service's default, Muon's for conv filters), "batch" as prod(shape[:-2]) independent
# shape[-2] x shape[-1] matrices (Emerging-Optimizers' batched newton_schulz).
ND_MODES = ("flatten", "batch")
# The longest a membership re-read of a retried group step waits for one address.
_MEMBERSHIP_TIMEOUT = 10.0
# The longest close() waits for the UnregisterRegion of each region still open.
_REGION_CLOSE_TIMEOUT = 5.0

T = TypeVar("T")


class Client:
    """A connection to an orthoserve fleet.

    Args:
      address_or_addresses: "HOST:PORT", or a list of them. Lone requests go to the first address (and fail over
        to the others, then to the fleet's ready members, on retryable failures); group steps go to the ready
        fleet member floor(rank * M / W) of the M ready members the server reports (see Group), or to the given
        list by the same rule when the server reports no members.
      tls: None (plaintext), True, a dict (root_certificates, private_key, certificate_chain) or credentials.
      token: bearer token sent as "authorization: Bearer <token>" on every call.
      timeout: default deadline in seconds of each attempt of a call (DEFAULT_TIMEOUT, 90 s; None: no deadline). An
        attempt that runs out of it is retried, at another address or fleet member when there is one, while the
        retry policy's deadline allows.
      keepalive_time, keepalive_timeout: HTTP/2 keepalive of every channel, seconds (DEFAULT_KEEPALIVE_TIME,
        DEFAULT_KEEPALIVE_TIMEOUT; see there); keepalive_time None sends no keepalive pings.
      retry: an orthoserve.RetryPolicy; None or True for the default policy, False to make every call a single
        attempt.
      fence_timeout: how long, in seconds, the client tries to fence a failed attempt that named shared-memory slices
        before it reports the failure or retries (orthoserve.fences; DEFAULT_FENCE_TIMEOUT, 120 s). When the fence
        cannot be made in that time the call fails with FailedPreconditionError: its slices may still be written.

    Attributes:
      retries: how many retries this client's calls have made (each one also logged as a warning on the
        "orthoserve" logger).
      channels: the client's connections (orthoserve.channels.Channels): a gRPC channel per address, the
        metadata of every call (the token) and the default deadline (`timeout`); the shared-memory regions call
        the server through them.
    """

    def __init__(self, address_or_addresses: Union[str, Sequence[str]], *, tls: Any = None,
                 token: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT, retry: Any = None,
                 keepalive_time: Optional[float] = DEFAULT_KEEPALIVE_TIME,
                 keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT,
                 fence_timeout: float = fences.DEFAULT_FENCE_TIMEOUT):
        if isinstance(address_or_addresses, str):
            addresses = [address_or_addresses]
        else:
            addresses = [str(a) for a in address_or_addresses]
        if not addresses:
            raise ValueError("orthoserve: Client needs at least one address")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"orthoserve: timeout must be > 0 seconds or None, got {timeout}")
        if keepalive_time is not None and not keepalive_time > 0:
            raise ValueError(f"orthoserve: keepalive_time must be > 0 seconds or None, got {keepalive_time}")
        if not keepalive_timeout > 0:
            raise ValueError(f"orthoserve: keepalive_timeout must be > 0 seconds, got {keepalive_timeout}")
        if not fence_timeout > 0:
            raise ValueError(f"orthoserve: fence_timeout must be > 0 seconds, got {fence_timeout}")
        self.addresses = addresses
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self.fence_timeout = float(fence_timeout)
        self.retry = retry_lib.policy_of(retry)
        self.retries = 0
        self.channels = channels_lib.Channels(channels_lib.credentials(tls), self._channel_options, token, timeout)
        self._lock = threading.Lock()
        self._infos: Dict[str, pb.ServerInfo] = {}
        self._fleet: Optional[pb.ServerInfo] = None  # The last answer that listed the fleet's members.
        self._regions: List["shm.Region"] = []  # Regions made by region(), for finding the arrays of a call in them.
        self._lone_address = addresses[0]  # Where lone requests go first: the last address that answered.

    # -- connections ---------------------------------------------------------------------------------------

    @property
    def timeout(self) -> Optional[float]:
        """The default deadline in seconds of each attempt of a call (None: no deadline); kept in `channels`."""
        return self.channels.timeout

    @timeout.setter
    def timeout(self, value: Optional[float]) -> None:
        self.channels.timeout = value

    def _channel_options(self) -> List[tuple]:
        """The options of this client's channels (its keepalive and retry settings when a channel is made)."""
        return channels_lib.channel_options(self.keepalive_time, self.keepalive_timeout, self.retry)

    def _stub(self, address: str) -> pb_grpc.OrthogonalizerStub:
        """The Orthogonalizer stub of `address`, through which every call of this client goes."""
        return self.channels.stub(address)

    # -- shared-memory regions -----------------------------------------------------------------------------

    def region(self, size: int, *, name: str = "", address: Optional[str] = None,
               timeout: Optional[float] = None) -> "shm.Region":
        """A shared-memory region of `size` bytes registered on `address` (default: the rank lone calls go to),
        for a client on the server's host (orthoserve.shm; the server needs --shm-socket). Its arrays may be
        given to orthogonalize() as inputs and in `out=`: the server reads and writes them in place. Raises
        OrthoserveError (FailedPreconditionError when the server does not take regions)."""
        target = address if address is not None else self.lone_targets()[0]
        r = shm.Region(self, target, size, name, timeout)
        with self._lock:
            self._regions = [x for x in self._regions if x.id] + [r]
        return r

    def close(self) -> None:
        """Unregisters the regions made by region() that are still open (each waiting at most
        _REGION_CLOSE_TIMEOUT; errors ignored, the memory is released here anyway) and closes every channel; the
        client is unusable afterwards."""
        with self._lock:
            regions, self._regions = self._regions, []
        for r in regions:
            try:
                r.close(timeout=_REGION_CLOSE_TIMEOUT)
            except errors.OrthoserveError:
                pass
        self.channels.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- retries -------------------------------------------------------------------------------------------

    def _count_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def new_attempts(self, timeout: Optional[float], what: str,
                     policy: Optional[retry_lib.RetryPolicy] = None) -> retry_lib.Attempts:
        """The attempts of one call named `what`, under `policy` (default: the client's; each retry counted in
        `retries`), each attempt bounded by `timeout` (default: the client's)."""
        return retry_lib.Attempts(self.retry if policy is None else policy, self.channels.deadline(timeout), what,
                                  self._count_retry, self.channels.reachability)

    def lone_targets(self) -> List[str]:
        """Where a lone request may go, in order: the last address that answered, the client's addresses, then
        the ready members of the newest membership seen."""
        with self._lock:
            fleet = self._fleet
            first = self._lone_address
        known = routing.ready_addresses(fleet) if fleet is not None else []
        return routing.unique([first, *self.addresses, *known])

    def _lone_call(self, what: str, timeout: Optional[float], attempt: Callable[[str, int, Optional[float]], T],
                   address: Optional[str] = None, policy: Optional[retry_lib.RetryPolicy] = None) -> T:
        """Runs attempt(address, number, timeout) under the retry policy (`policy`, default the client's): at
        `address` every time when given, else attempt k at the k-th of the lone targets (cycling; never the target
        the previous attempt failed on while there is another), remembering the one that answered."""
        attempts = self.new_attempts(timeout, what, policy)
        failed: Optional[str] = None
        while True:
            if address is not None:
                target = address
            else:
                targets = self.lone_targets()
                target = targets[attempts.number % len(targets)]
                if target == failed and len(targets) > 1:
                    target = targets[(attempts.number + 1) % len(targets)]
            attempts.what = f"{what} to {target}"
            try:
                result = attempt(target, attempts.number, attempts.timeout())
            except errors.OrthoserveError as e:
                if attempts.back_off(e):
                    failed = target
                    continue
                raise attempts.give_up(e) from None
            if address is None:
                with self._lock:
                    self._lone_address = target
            return result

    def _fenced(self, address: str, specs: Sequence[pb.MatrixSpec], attempt: Callable[[str], T],
                fence: bool = True) -> T:
        """Runs attempt(call_id) — one attempt to `address` — with a fresh call id when `specs` name region slices
        ("" when they name none, or when `fence` is False), and fences it when it fails (orthoserve.fences): the
        error raised is the attempt's once the server holds none of its slices, else a final
        FailedPreconditionError."""
        call_id = fences.new_call_id() if fence and fences.names_slices(specs) else ""
        try:
            return attempt(call_id)
        except errors.OrthoserveError as e:
            if not call_id:
                raise
            raise fences.fence(self.channels.channel(address), self.channels.metadata, address, call_id, e,
                               fence_timeout=self.fence_timeout, attempt_timeout=self.timeout) from None

    # -- server info ---------------------------------------------------------------------------------------

    def info_once(self, address: str, timeout: Optional[float]) -> pb.ServerInfo:
        """One GetServerInfo call to `address` (no retries); remembers it. Raises OrthoserveError."""
        try:
            info = self._stub(address).GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout,
                                                     metadata=self.channels.metadata)
        except grpc.RpcError as e:
            raise errors.error_from_rpc(e) from None
        with self._lock:
            self._infos[address] = info
            # The latest answer wins, whatever its generation: a fleet that restarts as a whole may count its
            # generations from the start again, and a stale view only costs a failed attempt and a re-read.
            if routing.member_addresses(info):
                self._fleet = info
        return info

    def info(self, address: Optional[str] = None, *, refresh: bool = False,
             timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo of `address` (default: the client's current lone address, failing over to the others on
        retryable failures), cached unless refresh; retried under the client's policy. Raises OrthoserveError."""
        if not refresh:
            with self._lock:
                cached = self._infos.get(address or self._lone_address)
            if cached is not None:
                return cached
        return self._lone_call("GetServerInfo", timeout,
                               lambda target, _, t: self.info_once(target, t), address=address)

    def _chunk_bytes(self, address: str, timeout: Optional[float]) -> int:
        with self._lock:
            info = self._infos.get(address)
        if info is None:
            info = self.info_once(address, timeout)
        limit = info.limits.chunk_bytes
        return int(limit) if limit > 0 else DEFAULT_CHUNK_BYTES

    def fleet_addresses(self) -> List[str]:
        """The public addresses of the fleet's ranks, ordered by rank (the client's addresses when the server
        lists no members)."""
        return routing.member_addresses(self.info()) or list(self.addresses)

    def _known_membership(self) -> pb.ServerInfo:
        """The last answer that listed the fleet's members, else info() (cached; retried)."""
        with self._lock:
            fleet = self._fleet
        return fleet if fleet is not None else self.info()

    def _membership(self, timeout: Optional[float], avoid: str = "") -> Optional[pb.ServerInfo]:
        """Re-reads the membership from the first reachable address (the client's, then the known members; `avoid`,
        where an attempt just failed, last: a stopped member would hold the read for its whole timeout), one call
        each without retries; None when none answers."""
        with self._lock:
            fleet = self._fleet
        known = routing.member_addresses(fleet) if fleet is not None else []
        candidates = routing.unique([*self.addresses, *(routing.ready_addresses(fleet) if fleet else []), *known])
        if avoid in candidates:
            candidates = [a for a in candidates if a != avoid] + [avoid]
        bound = _MEMBERSHIP_TIMEOUT if timeout is None else min(timeout, _MEMBERSHIP_TIMEOUT)
        for address in candidates:
            try:
                return self.info_once(address, bound)
            except errors.OrthoserveError:
                continue
        return None

    # -- whole matrices ------------------------------------------------------------------------------------

    def orthogonalize(self, matrices: Any, *, algorithm: Optional[str] = None, method: str = "stream",
                      timeout: Optional[float] = None, nd: str = "flatten", out: Any = None, **options: Any) -> Any:
        """Orthogonalizes whole matrices; returns results of the same type, dtype, shape and device.

        matrices: a list (or tuple) of numpy arrays / torch tensors (fp32, bf16, fp16; >= 2 dims); a single
        array gives a single result. options: NS options by name (coefficients, custom_coefficients, steps,
        precision, eps, eps_mode, transpose, scale_mode, extra_scale, split_qkv; orthoserve.options.ns_options,
        the NsOptions message of proto/orthoserve/v1/orthogonalizer.proto).
        nd: how arrays of >= 3 dims are read (MatrixSpec.nd_layout): "flatten" (one shape[0] x prod(rest) matrix)
        or "batch" (prod(shape[:-2]) independent shape[-2] x shape[-1] matrices, as Emerging-Optimizers'
        newton_schulz reads a (B, M, N) tensor; sent as one matrix, its result has the input's shape). An array
        of no matrices (a zero in shape[:-2]) gives an empty result without a call.
        method: "stream" (chunked, any size) or "unary" (one message; small matrices).
        Shared memory (orthoserve.shm, Client.region): an input that is an array of a region is read by the server
        in place; out (a list like `matrices`, None entries allowed; a single array for a single matrix) gives
        region arrays of the result's shape and dtype that the server writes the results into, and which are
        returned. A call with region arrays goes to their region's server rank only.
        Raises OrthoserveError (per-code subclasses) for a failed call or a failed matrix (naming it), after the
        client's retry policy gave up.
        """
        single = not isinstance(matrices, (list, tuple))
        items = [matrices] if single else list(matrices)
        per_matrix = [dict(options, algorithm=algorithm)] * len(items)
        outs = None if out is None else ([out] if single else list(out))
        results = self.orthogonalize_batch(items, per_matrix, method=method, timeout=timeout, nd=nd, out=outs)
        return results[0] if single else results

    def orthogonalize_batch(self, matrices: Sequence[Any], options: Sequence[Dict[str, Any]], *,
                            method: str = "stream", timeout: Optional[float] = None,
                            nd: str = "flatten", out: Optional[Sequence[Any]] = None, retry: Any = None,
                            fence: bool = True) -> List[Any]:
        """Like orthogonalize, with one options dict per matrix (NS options by name, "algorithm", "name" and "nd":
        that matrix's nd, overriding the call's `nd`).
        retry: this call's retry policy (as Client's `retry`: a RetryPolicy, or False for a single attempt); None:
        the client's.
        fence: False only for a single attempt (retry=False) whose caller never reads or writes its region arrays
        again once it failed (it drops the region, as orthoserve.torch's region transport does): a failed attempt is
        then not fenced (orthoserve.fences), and its error is raised at once, even when the server is unreachable."""
        policy = None if retry is None else retry_lib.policy_of(retry)
        if len(options) != len(matrices):
            raise ValueError(f"orthoserve: {len(matrices)} matrices but {len(options)} option sets")
        if out is not None and len(out) != len(matrices):
            raise ValueError(f"orthoserve: {len(matrices)} matrices but {len(out)} out arrays")
        pins = self._pins()
        if nd not in ND_MODES:
            raise ValueError(f"orthoserve: nd must be one of {ND_MODES}, got {nd!r}")
        if method not in ("stream", "unary"):
            raise ValueError(f"orthoserve: method must be 'stream' or 'unary', got {method!r}")
        if not matrices:
            return []
        entries: List[Entry] = []
        results: List[Any] = [None] * len(matrices)
        sent: List[int] = []  # Index in `matrices` of each entry.
        for i, (m, opts) in enumerate(zip(matrices, options)):
            opts = dict(opts)
            algo = options_lib.algorithm_value(opts.pop("algorithm", None))
            matrix_nd = opts.pop("nd", nd)
            if matrix_nd not in ND_MODES:
                raise ValueError(f"orthoserve: matrix {i}'s nd must be one of {ND_MODES}, got {matrix_nd!r}")
            info = arrays.describe(m, f"matrix {i}")
            arrays.matrix_view(info.shape)
            batched = matrix_nd == "batch" and len(info.shape) >= 3
            if batched and math.prod(info.shape[:-2]) == 0:
                results[i] = arrays.from_bytes(bytearray(), info, info.shape)  # No matrices: nothing to send.
                continue
            spec = pb.MatrixSpec(name=str(opts.pop("name", f"m{i}")), shape=info.shape, dtype=info.wire_dtype,
                                 options=options_lib.ns_options(opts), algorithm=algo)
            if batched:
                spec.nd_layout = pb.ND_LAYOUT_BATCH
            payload = arrays.to_bytes(m)
            target = None if out is None else out[i]
            region_slices.name_regions(pins, spec, m, target, f"matrix {i}", f"out[{i}]", info.shape)
            if spec.HasField("input_region"):
                payload = memoryview(b"")
            entries.append(Entry(spec, payload, info, info.shape, out=target))
            sent.append(i)
        if entries:
            specs = [e.spec for e in entries]
            if method == "unary":
                def unary(address: str, _: int, t: Optional[float]) -> List[Any]:
                    return self._fenced(address, specs, lambda call_id: self._unary(address, entries, t, call_id),
                                        fence)

                done = self._lone_call("Orthogonalize", timeout, unary, address=pins.address, policy=policy)
            else:
                def stream(address: str, attempt: int, t: Optional[float]) -> List[Any]:
                    def send(call_id: str) -> List[Any]:
                        header = pb.StepHeader(world=1, num_matrices=len(entries), attempt=attempt, call_id=call_id)
                        return self._stream(address, header, entries, t)

                    return self._fenced(address, specs, send, fence)

                done = self._lone_call("OrthogonalizeStream", timeout, stream, address=pins.address, policy=policy)
            for i, r in zip(sent, done):
                results[i] = r
        return results

    def _pins(self) -> region_slices.Pins:
        with self._lock:
            return region_slices.Pins([r for r in self._regions if r.id])

    def _unary(self, address: str, entries: List[Entry], timeout: Optional[float], call_id: str = "") -> List[Any]:
        """One Orthogonalize call of `entries` to `address` (under `call_id`, "" for none), bounded by `timeout`.
        Raises OrthoserveError."""
        return calls.unary(self._stub(address), entries, timeout, self.channels.metadata, call_id)

    def _stream(self, address: str, header: pb.StepHeader, entries: List[Entry],
                timeout: Optional[float]) -> List[Any]:
        """One attempt of one OrthogonalizeStream step to `address`, bounded by `timeout` (chunks of the size the
        server takes). Raises OrthoserveError."""
        chunk = self._chunk_bytes(address, timeout)
        return calls.stream(self._stub(address), address, header, entries, timeout, chunk, self.channels.metadata)

    # -- groups --------------------------------------------------------------------------------------------

    def group(self, job: str, name: str, rank: int, world: int, *, run_id: Optional[str] = None) -> "Group":
        """This trainer rank's handle on group (job, name) of `world` ranks (see Group).

        run_id: the run these steps belong to, the same on every rank of this run and no other run's (see Group);
        None takes it from $ORTHOSERVE_RUN_ID, $TORCHELASTIC_RUN_ID or torch.distributed (orthoserve.runs). ValueError
        when world > 1 and there is none."""
        return Group(self, job, name, rank, world, run_id=run_id)


class Group:
    """Trainer rank `rank` of a group of `world` ranks that together hold blocks of the same matrices.

    Every rank calls step(n, shards) with the same step number and the same ordered matrices (name, global
    shape, dtype, options, algorithm), each with its own block; the blocks of the W ranks tile each matrix.
    This rank's request goes to the ready fleet member at position floor(rank * M / W) of the M ready members
    sorted by rank (all members when none is marked ready). A step that fails retryably (or whose attempt ran out
    of its timeout) is retried under the client's policy: the membership is re-read (GetServerInfo from any
    reachable address), the rank re-routed by the same rule, except that the member the failed attempt went to is
    passed over for the next one while there is another, and the whole step sent again with StepHeader.attempt one
    higher. The member chosen stays this rank's until the next failure.

    Run id (StepHeader.run_id, sent on every attempt of every step when world > 1): the fleet keys a group step by
    tenant, job, group, step and run, so the reports of two runs (a relaunch, two members of a sweep) that use the
    same job, group and step numbers are never combined, and a retry is answered from kept inputs only for its own
    run. Every rank of one run must use the same id, and no other run the same. It is the explicit `run_id`, else
    $ORTHOSERVE_RUN_ID, else $TORCHELASTIC_RUN_ID (set by torchrun; its placeholder "none" is skipped), else, when
    torch.distributed is initialized, a random id agreed over the default process group (orthoserve.runs.agree_run_id:
    a collective on the first Group of the process, so every rank must make its first group at the same point, or
    call agree_run_id first); else ValueError. With world 1 no run id is sent (a lone step needs none).
    Two runs that share a job and group may still meet at the same step: the fleet then refuses the later one
    (FAILED_PRECONDITION naming both runs), so give concurrent runs their own job names too.

    Every result is checked against the spec this rank sent (orthoserve.IntegrityError on a mismatch).
    """

    def __init__(self, client: Client, job: str, name: str, rank: int, world: int, *, run_id: Optional[str] = None):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"orthoserve: group rank {rank} out of range for world {world}")
        self.client = client
        self.job = str(job)
        self.name = str(name)
        self.rank = int(rank)
        self.world = int(world)
        # None for a lone group (world 1): no run id is sent.
        self.run_id: Optional[str] = (
            runs.resolve_run_id(run_id, what=f"group {self.job}/{self.name}")
            if self.world > 1 else None)
        self._address: Optional[str] = None

    @property
    def address(self) -> str:
        """The fleet member's address this trainer rank streams to."""
        if self._address is None:
            self._address = routing.preferred_address(self.client._known_membership(), self.rank, self.world,
                                                      self.client.addresses)
        return self._address

    def _reroute(self, timeout: Optional[float], avoid: str) -> None:
        """Re-reads the membership (one GetServerInfo per address until one answers; the last one read when none
        answers) and picks this rank's member, other than `avoid` (where the last attempt failed) when the pool has
        another."""
        info = self.client._membership(timeout, avoid)
        if info is None:
            with self.client._lock:
                info = self.client._fleet
        self._address = routing.preferred_address(info if info is not None else pb.ServerInfo(), self.rank,
                                                  self.world, self.client.addresses, avoid)

    def step(self, step: int, shards: Sequence[layout.Shard], *, timeout: Optional[float] = None,
             out: Optional[Sequence[Any]] = None) -> List[Any]:
        """Sends this rank's blocks for step `step`; returns this rank's result blocks, in order, each of the
        same type, dtype, shape and device as the shard's data. `timeout` bounds each attempt (default: the
        client's; an attempt that runs out of it is retried at another member). Raises OrthoserveError once the
        client's retry policy gives up.

        Shared memory (orthoserve.shm, Client.region), as for orthogonalize: a shard whose data is an array of a
        region is read by the server in place; out (one entry per shard, None entries allowed) gives region arrays
        of the block's shape and dtype that the server writes this rank's result blocks into, and which are
        returned. A step with region arrays goes to their region's server rank only, on every attempt (its
        retries are not routed to another member). Other ranks of the group may send bytes or use regions of
        their own members."""
        if not shards:
            return []
        entries, pins = self._entries(shards, out)
        return self._attempts_of(step, shards, entries, pins, self.new_attempts(step, timeout))

    # The parts of step(), which a transport may put together in its own way: orthoserve.region_transport sends a
    # step's first attempt through a region (route, send) and, when that fails, its further attempts as bytes
    # (send_attempts), all numbered by one Attempts (StepHeader.attempt keeps increasing across the switch; see that
    # module). Every attempt of one step must come from one new_attempts (docs/architecture.md, "Replays").

    def new_attempts(self, step: int, timeout: Optional[float] = None) -> retry_lib.Attempts:
        """The attempts of step `step`: its attempt numbers, timeouts (`timeout`, default the client's), waits and
        retry deadline, under the client's retry policy."""
        return self.client.new_attempts(timeout, f"step {step} of group {self.job}/{self.name}")

    def send(self, step: int, shards: Sequence[layout.Shard], address: str, attempts: retry_lib.Attempts,
             out: Optional[Sequence[Any]] = None, fence: bool = True) -> List[Any]:
        """One attempt of step `step` to `address` (numbered attempts.number, bounded by attempts.timeout()), with
        the region slices the shards' data and `out` name (as step()); returns the result blocks. Raises
        OrthoserveError, ValueError for out arrays that do not fit. fence: as Client.orthogonalize_batch's."""
        entries, _ = self._entries(shards, out)
        return self._send(step, shards, entries, address, attempts, fence)

    def send_attempts(self, step: int, shards: Sequence[layout.Shard], attempts: retry_lib.Attempts,
                      failed: str = "", out: Optional[Sequence[Any]] = None) -> List[Any]:
        """Step `step`'s attempts from attempts.number on, as step() makes them, until one answers or the policy
        gives up (raising OrthoserveError); `failed`: the member an earlier attempt made elsewhere failed on."""
        entries, pins = self._entries(shards, out)
        return self._attempts_of(step, shards, entries, pins, attempts, failed)

    def _entries(self, shards: Sequence[layout.Shard],
                 out: Optional[Sequence[Any]]) -> Tuple[List[Entry], region_slices.Pins]:
        """The entries of `shards` (with the region slices their data and `out` name) and the member those regions
        pin the step to (pins.address; None when no array is in a region)."""
        if out is not None and len(out) != len(shards):
            raise ValueError(f"orthoserve: {len(shards)} shards but {len(out)} out arrays")
        pins = self.client._pins()
        entries = []
        for i, s in enumerate(shards):
            (r0, c0), (rows, cols) = s.offset, s.block
            spec = pb.MatrixSpec(name=s.name, shape=s.global_shape, dtype=s.info.wire_dtype,
                                 options=options_lib.ns_options(s.options),
                                 algorithm=options_lib.algorithm_value(s.algorithm),
                                 block=pb.Block(row_offset=r0, col_offset=c0, rows=rows, cols=cols))
            if s.partition_dim is not None:
                spec.partition_dim = int(s.partition_dim)
            if s.nd == "batch" and len(s.global_shape) >= 3:
                spec.nd_layout = pb.ND_LAYOUT_BATCH
            shape = s.info.shape if len(s.info.shape) >= 2 else (0, cols)
            target = None if out is None else out[i]
            payload = arrays.to_bytes(s.data)
            region_slices.name_regions(pins, spec, s.data, target, f"shard {s.name!r}", f"out[{i}]", s.info.shape)
            if spec.HasField("input_region"):
                payload = memoryview(b"")
            entries.append(Entry(spec, payload, s.info, shape, out=target))
        return entries, pins

    def route(self, attempts: retry_lib.Attempts, failed: str = "") -> str:
        """The member the current attempt goes to when no region pins it: this rank's member, and for a retry
        (attempts.number > 0) the one the re-read membership routes it to, passing over `failed`, the member the
        previous attempt failed on, while there is another."""
        if attempts.number > 0:
            self._reroute(attempts.timeout(), failed)
        return self.address

    def _send(self, step: int, shards: Sequence[layout.Shard], entries: List[Entry], address: str,
              attempts: retry_lib.Attempts, fence: bool = True) -> List[Any]:
        """One attempt of step `step` to `address`, numbered attempts.number and bounded by attempts.timeout();
        returns the result blocks. Raises OrthoserveError. fence: as Client.orthogonalize_batch's (False: the caller
        never uses the attempt's region arrays again once it failed)."""
        attempts.what = f"step {step} of group {self.job}/{self.name} rank {self.rank} to {address}"
        timeout = attempts.timeout()

        def send(call_id: str) -> List[Any]:
            header = pb.StepHeader(job=self.job, group=self.name, step=int(step), rank=self.rank, world=self.world,
                                   num_matrices=len(entries), attempt=attempts.number, run_id=self.run_id or "",
                                   call_id=call_id)
            return self.client._stream(address, header, entries, timeout)

        results = self.client._fenced(address, [e.spec for e in entries], send, fence)
        return [r.reshape(s.info.shape) if len(s.info.shape) < 2 else r for r, s in zip(results, shards)]

    def _attempts_of(self, step: int, shards: Sequence[layout.Shard], entries: List[Entry],
                     pins: region_slices.Pins, attempts: retry_lib.Attempts, failed: str = "") -> List[Any]:
        """Step `step`'s attempts from attempts.number on, until one answers or the policy gives up (raising
        OrthoserveError): to the pinned member, else to this rank's member, re-routed after a failure (`failed`:
        the member an earlier attempt made elsewhere failed on)."""
        while True:
            address = failed  # Where this attempt went, once known.
            try:
                address = pins.address if pins.address is not None else self.route(attempts, failed)
                return self._send(step, shards, entries, address, attempts)
            except errors.OrthoserveError as e:
                if not attempts.back_off(e):
                    raise attempts.give_up(e) from None
                failed = address
