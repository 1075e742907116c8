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
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc

from orthoserve import arrays, errors, fences, layout, options as options_lib, overdue, retry as retry_lib, routing, runs, shm
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

__all__ = ["Client", "Group", "DEFAULT_CHUNK_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_KEEPALIVE_TIME",
           "DEFAULT_KEEPALIVE_TIMEOUT", "ND_MODES"]

DEFAULT_CHUNK_BYTES = 4 << 20
# Seconds each attempt of a call may take unless the caller says otherwise. Longer than the service's default
# rendezvous timeout (60 s), so that a group step whose other trainer ranks never come ends with the server's ABORTED
# naming them rather than with a client timeout; shorter than the retry deadline (120 s), so that an attempt stuck on
# a stalled member leaves time for a retry elsewhere.
DEFAULT_TIMEOUT = 90.0
# HTTP/2 keepalive of every channel (seconds): a ping after this long without one while calls are in flight, and the
# connection is dropped (its calls fail with UNAVAILABLE, which is retried) when the ping is not answered within
# DEFAULT_KEEPALIVE_TIMEOUT: a server rank that stopped (SIGSTOP, a frozen node) is noticed within 15 s, about the
# fleet's peer timeout, and the call is retried elsewhere. orthoserve servers accept pings every second
# (--grpc-min-client-ping-interval); a server with gRPC's default enforcement (one ping in 5 minutes) would count these
# as "strikes" and close the connection with GOAWAY "too_many_pings" (retried; gRPC then doubles the interval for that
# channel): pass keepalive_time=300 for such servers. Pings are not sent on idle channels.
DEFAULT_KEEPALIVE_TIME = 10.0
DEFAULT_KEEPALIVE_TIMEOUT = 5.0
# Our messages are at most one chunk plus a few bytes; allow generous room for unary calls.
_MAX_MESSAGE_BYTES = 1 << 30
# How N-d (>= 3 dims) arrays are read as matrices (MatrixSpec.nd_layout): "flatten" as one shape[0] x prod(rest)
# matrix (the service's default, Muon's for conv filters), "batch" as prod(shape[:-2]) independent
# shape[-2] x shape[-1] matrices (Emerging-Optimizers' batched newton_schulz).
ND_MODES = ("flatten", "batch")
# The longest a membership re-read of a retried group step waits for one address.
_MEMBERSHIP_TIMEOUT = 10.0
# The longest close() waits for the UnregisterRegion of each region still open.
_REGION_CLOSE_TIMEOUT = 5.0

T = TypeVar("T")
def _read(value: Union[None, bytes, str]) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def _credentials(tls: Any) -> Optional[grpc.ChannelCredentials]:
    """None for plaintext; tls may be True (system roots), a grpc.ChannelCredentials, or a dict with
    root_certificates / private_key / certificate_chain given as bytes or file paths (mutual TLS with both
    of the last two)."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, dict):
        unknown = set(tls) - {"root_certificates", "private_key", "certificate_chain"}
        if unknown:
            raise TypeError(f"orthoserve: unknown tls keys {sorted(unknown)}")
        return grpc.ssl_channel_credentials(root_certificates=_read(tls.get("root_certificates")),
                                            private_key=_read(tls.get("private_key")),
                                            certificate_chain=_read(tls.get("certificate_chain")))
    raise TypeError(f"orthoserve: tls must be None, True, a dict or grpc.ChannelCredentials, got {type(tls)}")


_FLATTEN_LAYOUTS = (pb.ND_LAYOUT_UNSPECIFIED, pb.ND_LAYOUT_FLATTEN)  # Both mean "flatten" on the wire.


def _layout_name(value: int) -> str:
    return "batch" if value == pb.ND_LAYOUT_BATCH else "flatten" if value in _FLATTEN_LAYOUTS else f"unknown ({value})"


def _block_text(b: pb.Block) -> str:
    return f"{b.rows}x{b.cols} at ({b.row_offset}, {b.col_offset})"


class _Entry:
    """One matrix of a step: its spec, the bytes to send, how to rebuild its result, and the block its result must
    say it holds (the spec's block for a group step, the whole 2-D view for a whole matrix)."""

    __slots__ = ("spec", "payload", "info", "result_shape", "block", "out")

    def __init__(self, spec: pb.MatrixSpec, payload: memoryview, info: arrays.ArrayInfo, result_shape,
                 block: Optional[pb.Block] = None, out: Any = None):
        self.spec = spec
        self.payload = payload  # Empty when the input is in a shared-memory region (spec.input_region).
        self.out = out  # The region-backed array the result is written into (spec.result_region), or None.
        self.info = info
        self.result_shape = result_shape
        if block is None:
            if spec.HasField("block"):
                block = spec.block
            else:
                nd = "batch" if spec.nd_layout == pb.ND_LAYOUT_BATCH else "flatten"
                rows, cols = arrays.matrix_view(tuple(spec.shape), nd)
                block = pb.Block(row_offset=0, col_offset=0, rows=rows, cols=cols)
        self.block = block


class _Pins:
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


def _check_index(index: int, entries: Sequence[_Entry], seen: Any) -> None:
    """IntegrityError unless 0 <= index < len(entries) and index is not in `seen` (the indices answered so far)."""
    count = len(entries)
    if not 0 <= index < count:
        raise errors.integrity_error(f"the server answered with result index {index}, but this request has "
                                     f"{count} matrices (indices 0..{count - 1}); its results are not this "
                                     "caller's", index=index)
    if index in seen:
        raise errors.integrity_error(f"the server answered index {index} twice; its results are not this caller's",
                                     entries[index].spec.name, index)


def _check_batch_echo(entry: _Entry, result: pb.MatrixResult) -> None:
    """FailedPreconditionError when a batch (nd_layout=batch) was answered without nd_layout=batch."""
    if entry.spec.nd_layout == pb.ND_LAYOUT_BATCH and result.nd_layout != pb.ND_LAYOUT_BATCH:
        # A server that predates NdLayout ignores the field and answers for the flattened matrix: a different
        # computation, of the same size. Never return it as the batch's answer.
        raise errors.FailedPreconditionError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "the server did not read this tensor as a batch of matrices (its result does not echo nd_layout=batch: "
            "it predates MatrixSpec.nd_layout and computed the flattened matrix); upgrade the server, or send "
            "nd='flatten' if that is what you mean", entry.spec.name)


def _check_result(entry: _Entry, index: int, result: pb.MatrixResult) -> None:
    """IntegrityError unless `result` (a successful one) names what `entry` sent at `index`: name, global shape,
    N-d layout and block. FailedPreconditionError for a batch answered as a flattened matrix (Client._rebuild)."""
    _check_batch_echo(entry, result)  # A server that predates NdLayout: its own, clearer error.
    spec, problems = entry.spec, []
    sent_batch = spec.nd_layout == pb.ND_LAYOUT_BATCH
    if result.name != spec.name:
        problems.append(f"name {result.name!r} (sent {spec.name!r})")
    if tuple(result.shape) != tuple(spec.shape):
        problems.append(f"shape {list(result.shape)} (sent {list(spec.shape)})")
    if result.nd_layout not in (*_FLATTEN_LAYOUTS, pb.ND_LAYOUT_BATCH) or (
            result.nd_layout == pb.ND_LAYOUT_BATCH and not sent_batch):
        problems.append(f"nd_layout {_layout_name(result.nd_layout)} (sent {_layout_name(spec.nd_layout)})")
    if result.block != entry.block:
        problems.append(f"block {_block_text(result.block)} (sent {_block_text(entry.block)})")
    if problems:
        raise errors.integrity_error(f"result index {index} is not the result of what this rank sent there: it has "
                                     f"{', '.join(problems)}; refusing to return it", spec.name, index)


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
        self.timeout = timeout
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self.fence_timeout = float(fence_timeout)
        self.retry = retry_lib.policy_of(retry)
        self.retries = 0
        self._credentials = _credentials(tls)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._lock = threading.Lock()
        self._channels: Dict[str, grpc.Channel] = {}
        self._stubs: Dict[str, pb_grpc.OrthogonalizerStub] = {}
        self._infos: Dict[str, pb.ServerInfo] = {}
        self._fleet: Optional[pb.ServerInfo] = None  # The last answer that listed the fleet's members.
        self._regions: List["shm.Region"] = []  # Regions made by region(), for finding the arrays of a call in them.
        self._lone_address = addresses[0]  # Where lone requests go first: the last address that answered.

    # -- connections ---------------------------------------------------------------------------------------

    def _channel_options(self) -> List[tuple]:
        opts = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES)]
        if self.keepalive_time is not None:
            opts += [("grpc.keepalive_time_ms", max(1, int(self.keepalive_time * 1000))),
                     ("grpc.keepalive_timeout_ms", max(1, int(self.keepalive_timeout * 1000))),
                     # Newer gRPC cores (grpcio 1.85 here) end an unanswered keepalive ping only after this, which
                     # defaults to a minute: keep it the keepalive timeout.
                     ("grpc.http2.ping_timeout_ms", max(1, int(self.keepalive_timeout * 1000))),
                     ("grpc.keepalive_permit_without_calls", 0),
                     # A long step (a rendezvous, a large batch) may send nothing for minutes: keep pinging through
                     # it (gRPC otherwise stops after two pings without data, and a dead peer goes unnoticed).
                     ("grpc.http2.max_pings_without_data", 0),
                     # Keepalive guards an established connection only: a connection attempt to a server that
                     # accepts TCP but does not answer (a stopped process) would otherwise hold the calls waiting
                     # for it for gRPC's 20 s minimum connect timeout. Give it up as keepalive would.
                     ("grpc.min_reconnect_backoff_ms",
                      max(1, int((self.keepalive_time + self.keepalive_timeout) * 1000)))]
        if self.retry.enabled:
            # A channel whose server went away reconnects with gRPC's own backoff (up to 120 s by default), and
            # calls fail at once with UNAVAILABLE until it does; keep it within the retry policy's waits, so a
            # restarted rank is used again soon after it is back.
            opts += [("grpc.initial_reconnect_backoff_ms", max(100, int(self.retry.initial_backoff * 1000))),
                     ("grpc.max_reconnect_backoff_ms", max(100, int(self.retry.max_backoff * 1000)))]
        return opts

    def _stub(self, address: str) -> pb_grpc.OrthogonalizerStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                opts = self._channel_options()
                if self._credentials is None:
                    channel = grpc.insecure_channel(address, options=opts)
                else:
                    channel = grpc.secure_channel(address, self._credentials, options=opts)
                self._channels[address] = channel
                stub = self._stubs[address] = pb_grpc.OrthogonalizerStub(channel)
            return stub

    def _channel(self, address: str) -> grpc.Channel:
        """The channel to `address` (made on first use)."""
        self._stub(address)
        with self._lock:
            return self._channels[address]

    # -- shared-memory regions -----------------------------------------------------------------------------

    def region(self, size: int, *, name: str = "", address: Optional[str] = None,
               timeout: Optional[float] = None) -> "shm.Region":
        """A shared-memory region of `size` bytes registered on `address` (default: the rank lone calls go to),
        for a client on the server's host (orthoserve.shm; the server needs --shm-socket). Its arrays may be
        given to orthogonalize() as inputs and in `out=`: the server reads and writes them in place. Raises
        OrthoserveError (FailedPreconditionError when the server does not take regions)."""
        target = address if address is not None else self._lone_targets()[0]
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
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    # -- retries -------------------------------------------------------------------------------------------

    def _count_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def _attempts(self, timeout: Optional[float], what: str,
                  policy: Optional[retry_lib.RetryPolicy] = None) -> retry_lib.Attempts:
        return retry_lib.Attempts(self.retry if policy is None else policy, self._deadline(timeout), what,
                                  self._count_retry)

    def _lone_targets(self) -> List[str]:
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
        attempts = self._attempts(timeout, what, policy)
        failed: Optional[str] = None
        while True:
            if address is not None:
                target = address
            else:
                targets = self._lone_targets()
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

    def _fenced(self, address: str, specs: Sequence[pb.MatrixSpec], attempt: Callable[[str], T]) -> T:
        """Runs attempt(call_id) — one attempt to `address` — with a fresh call id when `specs` name region slices
        ("" when they name none), and fences it when it fails (orthoserve.fences): the error raised is the attempt's
        once the server holds none of its slices, else a final FailedPreconditionError."""
        call_id = fences.new_call_id() if fences.names_slices(specs) else ""
        try:
            return attempt(call_id)
        except errors.OrthoserveError as e:
            if not call_id:
                raise
            raise fences.fence(self._channel(address), self._metadata, address, call_id, e,
                               fence_timeout=self.fence_timeout, attempt_timeout=self.timeout) from None

    # -- server info ---------------------------------------------------------------------------------------

    def _info_once(self, address: str, timeout: Optional[float]) -> pb.ServerInfo:
        """One GetServerInfo call to `address` (no retries); remembers it. Raises OrthoserveError."""
        try:
            info = self._stub(address).GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout,
                                                     metadata=self._metadata)
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
                               lambda target, _, t: self._info_once(target, t), address=address)

    def _chunk_bytes(self, address: str, timeout: Optional[float]) -> int:
        with self._lock:
            info = self._infos.get(address)
        if info is None:
            info = self._info_once(address, timeout)
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
                return self._info_once(address, bound)
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
                            nd: str = "flatten", out: Optional[Sequence[Any]] = None, retry: Any = None) -> List[Any]:
        """Like orthogonalize, with one options dict per matrix (NS options by name, "algorithm" and "name").
        retry: this call's retry policy (as Client's `retry`: a RetryPolicy, or False for a single attempt); None:
        the client's."""
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
        entries: List[_Entry] = []
        results: List[Any] = [None] * len(matrices)
        sent: List[int] = []  # Index in `matrices` of each entry.
        for i, (m, opts) in enumerate(zip(matrices, options)):
            opts = dict(opts)
            algo = options_lib.algorithm_value(opts.pop("algorithm", None))
            info = arrays.describe(m, f"matrix {i}")
            arrays.matrix_view(info.shape)
            batched = nd == "batch" and len(info.shape) >= 3
            if batched and math.prod(info.shape[:-2]) == 0:
                results[i] = arrays.from_bytes(bytearray(), info, info.shape)  # No matrices: nothing to send.
                continue
            spec = pb.MatrixSpec(name=str(opts.pop("name", f"m{i}")), shape=info.shape, dtype=info.wire_dtype,
                                 options=options_lib.ns_options(opts), algorithm=algo)
            if batched:
                spec.nd_layout = pb.ND_LAYOUT_BATCH
            payload = arrays.to_bytes(m)
            target = None if out is None else out[i]
            self._name_regions(pins, spec, m, target, f"matrix {i}", f"out[{i}]", info.shape)
            if spec.HasField("input_region"):
                payload = memoryview(b"")
            entries.append(_Entry(spec, payload, info, info.shape, out=target))
            sent.append(i)
        if entries:
            specs = [e.spec for e in entries]
            if method == "unary":
                def unary(address: str, _: int, t: Optional[float]) -> List[Any]:
                    return self._fenced(address, specs, lambda call_id: self._unary(address, entries, t, call_id))

                done = self._lone_call("Orthogonalize", timeout, unary, address=pins.address, policy=policy)
            else:
                def stream(address: str, attempt: int, t: Optional[float]) -> List[Any]:
                    def send(call_id: str) -> List[Any]:
                        header = pb.StepHeader(world=1, num_matrices=len(entries), attempt=attempt, call_id=call_id)
                        return self._stream(address, header, entries, t)

                    return self._fenced(address, specs, send)

                done = self._lone_call("OrthogonalizeStream", timeout, stream, address=pins.address, policy=policy)
            for i, r in zip(sent, done):
                results[i] = r
        return results

    def _pins(self) -> _Pins:
        with self._lock:
            return _Pins([r for r in self._regions if r.id])

    @staticmethod
    def _name_regions(pins: _Pins, spec: pb.MatrixSpec, data: Any, target: Any, what: str, out_what: str,
                      shape: Tuple[int, ...]) -> None:
        """Names in `spec` the region slice holding `data` (its input_region, when a region holds it) and that of
        `target` (its result_region; an out array of `shape` and data's dtype, or None)."""
        piece = pins.input(data, what)
        if piece is not None:
            spec.input_region.CopyFrom(piece)
        if target is not None:
            spec.result_region.CopyFrom(pins.result(target, out_what, shape, data.dtype))

    def _unary(self, address: str, entries: List[_Entry], timeout: Optional[float], call_id: str = "") -> List[Any]:
        request = pb.OrthogonalizeRequest(
            matrices=[pb.Matrix(spec=e.spec, data=bytes(e.payload)) for e in entries], call_id=call_id)
        try:
            response = self._stub(address).Orthogonalize(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.error_from_rpc(e) from None
        by_index: Dict[int, pb.MatrixResult] = {}
        for r in response.results:
            _check_index(r.index, entries, by_index)
            by_index[r.index] = r
        out = []
        for i, e in enumerate(entries):
            r = by_index.get(i)
            if r is None:
                raise errors.InternalError(grpc.StatusCode.INTERNAL, "the server returned no result", e.spec.name)
            if r.code != 0:
                raise errors.error_from_code(r.code, r.message, e.spec.name)
            _check_result(e, i, r)
            out.append(self._in_region(e, r) if e.out is not None else self._rebuild(e, r, bytearray(r.data)))
        return out

    @staticmethod
    def _in_region(entry: _Entry, result: pb.MatrixResult) -> Any:
        """The out array of a result the server wrote into its region; IntegrityError when the result does not
        say it is there."""
        if result.result_region != entry.spec.result_region or result.data:
            raise errors.integrity_error("the result was not written into the region slice this call named",
                                         entry.spec.name)
        return entry.out

    @staticmethod
    def _expected_bytes(entry: _Entry, result: pb.MatrixResult) -> int:
        rows, cols = arrays.matrix_view(entry.result_shape) if len(entry.result_shape) >= 2 else (0, 0)
        dtype = result.dtype or entry.spec.dtype
        return rows * cols * arrays.ITEMSIZE.get(dtype, 0)

    @staticmethod
    def _rebuild(entry: _Entry, result: pb.MatrixResult, buf: bytearray) -> Any:
        if result.dtype not in (pb.DTYPE_UNSPECIFIED, entry.spec.dtype):
            raise errors.integrity_error(f"result dtype {result.dtype} differs from the sent {entry.spec.dtype}",
                                         entry.spec.name)
        _check_batch_echo(entry, result)
        expected = Client._expected_bytes(entry, result)
        if len(buf) != expected:
            raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                       f"result has {len(buf)} bytes, expected {expected}", entry.spec.name)
        return arrays.from_bytes(buf, entry.info, entry.result_shape)

    def _stream(self, address: str, header: pb.StepHeader, entries: List[_Entry],
                timeout: Optional[float]) -> List[Any]:
        """One attempt of one OrthogonalizeStream step (header, (spec, chunks)*, end) to `address`, bounded by
        `timeout`; collects results by index. Raises OrthoserveError."""
        chunk = self._chunk_bytes(address, timeout)

        def requests() -> Iterator[pb.StreamRequest]:
            yield pb.StreamRequest(header=header)
            for index, e in enumerate(entries):
                yield pb.StreamRequest(spec=e.spec)
                payload = e.payload
                for start in range(0, len(payload), chunk):
                    yield pb.StreamRequest(chunk=pb.DataChunk(index=index, data=bytes(payload[start:start + chunk])))
            yield pb.StreamRequest(end=pb.StepEnd())

        results: Dict[int, pb.MatrixResult] = {}
        buffers: Dict[int, bytearray] = {}
        filled: Dict[int, int] = {}
        summary = None
        call = self._stub(address).OrthogonalizeStream(requests(), timeout=timeout, metadata=self._metadata)
        with overdue.OverdueGuard(call, timeout, f"the stream to {address}") as guard:
            try:
                for response in call:
                    kind = response.WhichOneof("kind")
                    if kind == "result":
                        r = response.result
                        _check_index(r.index, entries, results)
                        results[r.index] = r
                        if r.code == 0:
                            # Checked before any of its bytes are taken: data of another matrix is never assembled.
                            _check_result(entries[r.index], r.index, r)
                            # A result in a region has no chunks: an empty buffer takes none.
                            in_region = entries[r.index].out is not None
                            buffers[r.index] = bytearray(0 if in_region else self._expected_bytes(entries[r.index], r))
                            filled[r.index] = 0
                    elif kind == "chunk":
                        c = response.chunk
                        buf = buffers.get(c.index)
                        if buf is None or filled[c.index] + len(c.data) > len(buf):
                            raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                                       f"unexpected data chunk for matrix index {c.index}")
                        buf[filled[c.index]:filled[c.index] + len(c.data)] = c.data
                        filled[c.index] += len(c.data)
                    elif kind == "summary":
                        summary = response.summary
            except grpc.RpcError as e:
                raise guard.check(e) from None
            except errors.OrthoserveError:
                call.cancel()  # The answer is refused (a wrong index, result or chunk): nothing more of it is read.
                raise
        if summary is None:
            raise errors.InternalError(grpc.StatusCode.INTERNAL, "the stream ended without a step summary")
        failed = [i for i in sorted(results) if results[i].code != 0]
        if failed:
            first = results[failed[0]]
            more = f" (and {len(failed) - 1} more failed matrices)" if len(failed) > 1 else ""
            raise errors.error_from_code(first.code, first.message + more, entries[failed[0]].spec.name)
        out = []
        for i, e in enumerate(entries):
            if i not in results:
                raise errors.InternalError(grpc.StatusCode.INTERNAL, "the server returned no result", e.spec.name)
            if filled[i] != len(buffers[i]):
                raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                           f"received {filled[i]} of {len(buffers[i])} result bytes", e.spec.name)
            r = results[i]
            out.append(self._in_region(e, r) if e.out is not None else self._rebuild(e, r, buffers[i]))
        return out

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
        return self._attempts_of(step, shards, entries, pins, self._new_attempts(step, timeout))

    # The parts of step(), which orthoserve.region_transport also puts together in its own way: it sends a step's
    # first attempt through a region and, when that fails, its further attempts as bytes, all numbered by one
    # Attempts (StepHeader.attempt keeps increasing across the switch; see that module).

    def _new_attempts(self, step: int, timeout: Optional[float]) -> retry_lib.Attempts:
        """The attempts of one step: its attempt numbers, timeouts, waits and retry deadline."""
        return self.client._attempts(timeout, f"step {step} of group {self.job}/{self.name}")

    def _entries(self, shards: Sequence[layout.Shard], out: Optional[Sequence[Any]]) -> Tuple[List[_Entry], _Pins]:
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
            self.client._name_regions(pins, spec, s.data, target, f"shard {s.name!r}", f"out[{i}]", s.info.shape)
            if spec.HasField("input_region"):
                payload = memoryview(b"")
            entries.append(_Entry(spec, payload, s.info, shape, out=target))
        return entries, pins

    def _member(self, attempts: retry_lib.Attempts, failed: str) -> str:
        """The member the current attempt goes to when no region pins it: this rank's member, and for a retry
        (attempts.number > 0) the one the re-read membership routes it to, passing over `failed`, the member the
        previous attempt failed on, while there is another."""
        if attempts.number > 0:
            self._reroute(attempts.timeout(), failed)
        return self.address

    def _send(self, step: int, shards: Sequence[layout.Shard], entries: List[_Entry], address: str,
              attempts: retry_lib.Attempts) -> List[Any]:
        """One attempt of step `step` to `address`, numbered attempts.number and bounded by attempts.timeout();
        returns the result blocks. Raises OrthoserveError."""
        attempts.what = f"step {step} of group {self.job}/{self.name} rank {self.rank} to {address}"
        timeout = attempts.timeout()

        def send(call_id: str) -> List[Any]:
            header = pb.StepHeader(job=self.job, group=self.name, step=int(step), rank=self.rank, world=self.world,
                                   num_matrices=len(entries), attempt=attempts.number, run_id=self.run_id or "",
                                   call_id=call_id)
            return self.client._stream(address, header, entries, timeout)

        results = self.client._fenced(address, [e.spec for e in entries], send)
        return [r.reshape(s.info.shape) if len(s.info.shape) < 2 else r for r, s in zip(results, shards)]

    def _attempts_of(self, step: int, shards: Sequence[layout.Shard], entries: List[_Entry], pins: _Pins,
                     attempts: retry_lib.Attempts, failed: str = "") -> List[Any]:
        """Step `step`'s attempts from attempts.number on, until one answers or the policy gives up (raising
        OrthoserveError): to the pinned member, else to this rank's member, re-routed after a failure (`failed`:
        the member an earlier attempt made elsewhere failed on)."""
        while True:
            address = failed  # Where this attempt went, once known.
            try:
                address = pins.address if pins.address is not None else self._member(attempts, failed)
                return self._send(step, shards, entries, address, attempts)
            except errors.OrthoserveError as e:
                if not attempts.back_off(e):
                    raise attempts.give_up(e) from None
                failed = address
