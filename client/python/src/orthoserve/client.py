"""The orthoserve client: whole matrices of a lone client, and group steps of sharded matrices (DESIGN §3, §5).

A Client holds one gRPC channel per server address; it is safe to share between threads (gRPC channels are),
and a Group may be used by one thread at a time.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import grpc

from orthoserve import arrays, errors, layout, options as options_lib
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

__all__ = ["Client", "Group", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 4 << 20
# Our messages are at most one chunk plus a few bytes; allow generous room for unary calls.
_MAX_MESSAGE_BYTES = 1 << 30


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


class _Entry:
    """One matrix of a step: its spec, the bytes to send, and how to rebuild its result."""

    __slots__ = ("spec", "payload", "info", "result_shape")

    def __init__(self, spec: pb.MatrixSpec, payload: memoryview, info: arrays.ArrayInfo, result_shape):
        self.spec = spec
        self.payload = payload
        self.info = info
        self.result_shape = result_shape


class Client:
    """A connection to an orthoserve fleet.

    Args:
      address_or_addresses: "HOST:PORT", or a list of them. Lone requests go to the first address; group steps
        go to the fleet rank floor(rank * S / W) of the fleet the first address reports (its `members`), or
        to the given list in order when the server reports no members.
      tls: None (plaintext), True, a dict (root_certificates, private_key, certificate_chain) or credentials.
      token: bearer token sent as "authorization: Bearer <token>" on every call.
      timeout: default deadline in seconds of each call (None: no deadline).
    """

    def __init__(self, address_or_addresses: Union[str, Sequence[str]], *, tls: Any = None,
                 token: Optional[str] = None, timeout: Optional[float] = None):
        if isinstance(address_or_addresses, str):
            addresses = [address_or_addresses]
        else:
            addresses = [str(a) for a in address_or_addresses]
        if not addresses:
            raise ValueError("orthoserve: Client needs at least one address")
        self.addresses = addresses
        self.timeout = timeout
        self._credentials = _credentials(tls)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._lock = threading.Lock()
        self._channels: Dict[str, grpc.Channel] = {}
        self._stubs: Dict[str, pb_grpc.OrthogonalizerStub] = {}
        self._infos: Dict[str, pb.ServerInfo] = {}

    # -- connections ---------------------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.OrthogonalizerStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                opts = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES)]
                if self._credentials is None:
                    channel = grpc.insecure_channel(address, options=opts)
                else:
                    channel = grpc.secure_channel(address, self._credentials, options=opts)
                self._channels[address] = channel
                stub = self._stubs[address] = pb_grpc.OrthogonalizerStub(channel)
            return stub

    def close(self) -> None:
        """Closes every channel; the client is unusable afterwards."""
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

    def info(self, address: Optional[str] = None, *, refresh: bool = False,
             timeout: Optional[float] = None) -> pb.ServerInfo:
        """GetServerInfo of `address` (default: the first), cached unless refresh. Raises OrthoserveError."""
        address = address or self.addresses[0]
        if not refresh and address in self._infos:
            return self._infos[address]
        try:
            info = self._stub(address).GetServerInfo(pb.GetServerInfoRequest(), timeout=self._deadline(timeout),
                                                     metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.error_from_rpc(e) from None
        self._infos[address] = info
        return info

    def _chunk_bytes(self, address: str) -> int:
        limit = self.info(address).limits.chunk_bytes
        return int(limit) if limit > 0 else DEFAULT_CHUNK_BYTES

    def fleet_addresses(self) -> List[str]:
        """The public addresses of the fleet's ranks, ordered by rank."""
        members = sorted(self.info().members, key=lambda m: m.rank)
        if members and all(m.address for m in members):
            return [m.address for m in members]
        return list(self.addresses)

    # -- whole matrices ------------------------------------------------------------------------------------

    def orthogonalize(self, matrices: Any, *, algorithm: Optional[str] = None, method: str = "stream",
                      timeout: Optional[float] = None, **options: Any) -> Any:
        """Orthogonalizes whole matrices; returns results of the same type, dtype, shape and device.

        matrices: a list (or tuple) of numpy arrays / torch tensors (fp32, bf16, fp16; >= 2 dims, N-d viewed as
        shape[0] x prod(rest)); a single array gives a single result. options: DESIGN §2 names (coefficients,
        custom_coefficients, steps, precision, eps, eps_mode, transpose, scale_mode, extra_scale, split_qkv).
        method: "stream" (chunked, any size) or "unary" (one message; small matrices).
        Raises OrthoserveError (per-code subclasses) for a failed call or a failed matrix (naming it).
        """
        single = not isinstance(matrices, (list, tuple))
        items = [matrices] if single else list(matrices)
        per_matrix = [dict(options, algorithm=algorithm)] * len(items)
        results = self.orthogonalize_batch(items, per_matrix, method=method, timeout=timeout)
        return results[0] if single else results

    def orthogonalize_batch(self, matrices: Sequence[Any], options: Sequence[Dict[str, Any]], *,
                            method: str = "stream", timeout: Optional[float] = None) -> List[Any]:
        """Like orthogonalize, with one options dict per matrix (NS options by name, and "algorithm")."""
        if len(options) != len(matrices):
            raise ValueError(f"orthoserve: {len(matrices)} matrices but {len(options)} option sets")
        if not matrices:
            return []
        entries = []
        for i, (m, opts) in enumerate(zip(matrices, options)):
            opts = dict(opts)
            algo = options_lib.algorithm_value(opts.pop("algorithm", None))
            info = arrays.describe(m, f"matrix {i}")
            arrays.matrix_view(info.shape)
            spec = pb.MatrixSpec(name=str(opts.pop("name", f"m{i}")), shape=info.shape, dtype=info.wire_dtype,
                                 options=options_lib.ns_options(opts), algorithm=algo)
            entries.append(_Entry(spec, arrays.to_bytes(m), info, info.shape))
        address = self.addresses[0]
        if method == "unary":
            return self._unary(address, entries, timeout)
        if method == "stream":
            header = pb.StepHeader(world=1, num_matrices=len(entries))
            return self._stream(address, header, entries, timeout)
        raise ValueError(f"orthoserve: method must be 'stream' or 'unary', got {method!r}")

    def _unary(self, address: str, entries: List[_Entry], timeout: Optional[float]) -> List[Any]:
        request = pb.OrthogonalizeRequest(
            matrices=[pb.Matrix(spec=e.spec, data=bytes(e.payload)) for e in entries])
        try:
            response = self._stub(address).Orthogonalize(request, timeout=self._deadline(timeout),
                                                         metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.error_from_rpc(e) from None
        by_index = {r.index: r for r in response.results}
        out = []
        for i, e in enumerate(entries):
            r = by_index.get(i)
            if r is None:
                raise errors.InternalError(grpc.StatusCode.INTERNAL, "the server returned no result", e.spec.name)
            if r.code != 0:
                raise errors.error_from_code(r.code, r.message, e.spec.name)
            out.append(self._rebuild(e, r, bytearray(r.data)))
        return out

    @staticmethod
    def _expected_bytes(entry: _Entry, result: pb.MatrixResult) -> int:
        rows, cols = arrays.matrix_view(entry.result_shape) if len(entry.result_shape) >= 2 else (0, 0)
        dtype = result.dtype or entry.spec.dtype
        return rows * cols * arrays.ITEMSIZE.get(dtype, 0)

    @staticmethod
    def _rebuild(entry: _Entry, result: pb.MatrixResult, buf: bytearray) -> Any:
        if result.dtype not in (pb.DTYPE_UNSPECIFIED, entry.spec.dtype):
            raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                       f"result dtype {result.dtype} differs from the sent {entry.spec.dtype}",
                                       entry.spec.name)
        expected = Client._expected_bytes(entry, result)
        if len(buf) != expected:
            raise errors.InternalError(grpc.StatusCode.INTERNAL,
                                       f"result has {len(buf)} bytes, expected {expected}", entry.spec.name)
        return arrays.from_bytes(buf, entry.info, entry.result_shape)

    def _stream(self, address: str, header: pb.StepHeader, entries: List[_Entry],
                timeout: Optional[float]) -> List[Any]:
        """Runs one OrthogonalizeStream step: header, (spec, chunks)*, end; collects results by index."""
        chunk = self._chunk_bytes(address)

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
        try:
            for response in self._stub(address).OrthogonalizeStream(
                    requests(), timeout=self._deadline(timeout), metadata=self._metadata):
                kind = response.WhichOneof("kind")
                if kind == "result":
                    r = response.result
                    if not 0 <= r.index < len(entries) or r.index in results:
                        raise errors.InternalError(grpc.StatusCode.INTERNAL, f"unexpected result index {r.index}")
                    results[r.index] = r
                    if r.code == 0:
                        buffers[r.index] = bytearray(self._expected_bytes(entries[r.index], r))
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
            raise errors.error_from_rpc(e) from None
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
            out.append(self._rebuild(e, results[i], buffers[i]))
        return out

    # -- groups --------------------------------------------------------------------------------------------

    def group(self, job: str, name: str, rank: int, world: int) -> "Group":
        """This trainer rank's handle on group (job, name) of `world` ranks (see Group)."""
        return Group(self, job, name, rank, world)


class Group:
    """Trainer rank `rank` of a group of `world` ranks that together hold blocks of the same matrices.

    Every rank calls step(n, shards) with the same step number and the same ordered matrices (name, global
    shape, dtype, options, algorithm), each with its own block; the blocks of the W ranks tile each matrix.
    This rank's request goes to fleet rank floor(rank * S / W).
    """

    def __init__(self, client: Client, job: str, name: str, rank: int, world: int):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"orthoserve: group rank {rank} out of range for world {world}")
        self.client = client
        self.job = str(job)
        self.name = str(name)
        self.rank = int(rank)
        self.world = int(world)
        self._address: Optional[str] = None

    @property
    def address(self) -> str:
        """The fleet rank's address this trainer rank streams to."""
        if self._address is None:
            fleet = self.client.fleet_addresses()
            self._address = fleet[self.rank * len(fleet) // self.world]
        return self._address

    def step(self, step: int, shards: Sequence[layout.Shard], *, timeout: Optional[float] = None) -> List[Any]:
        """Sends this rank's blocks for step `step`; returns this rank's result blocks, in order, each of the
        same type, dtype, shape and device as the shard's data. Raises OrthoserveError."""
        if not shards:
            return []
        entries = []
        for s in shards:
            (r0, c0), (rows, cols) = s.offset, s.block
            spec = pb.MatrixSpec(name=s.name, shape=s.global_shape, dtype=s.info.wire_dtype,
                                 options=options_lib.ns_options(s.options),
                                 algorithm=options_lib.algorithm_value(s.algorithm),
                                 block=pb.Block(row_offset=r0, col_offset=c0, rows=rows, cols=cols))
            if s.partition_dim is not None:
                spec.partition_dim = int(s.partition_dim)
            shape = s.info.shape if len(s.info.shape) >= 2 else (0, cols)
            entries.append(_Entry(spec, arrays.to_bytes(s.data), s.info, shape))
        header = pb.StepHeader(job=self.job, group=self.name, step=int(step), rank=self.rank, world=self.world,
                               num_matrices=len(entries))
        results = self.client._stream(self.address, header, entries, timeout)
        return [r.reshape(s.info.shape) if len(s.info.shape) < 2 else r for r, s in zip(results, shards)]
