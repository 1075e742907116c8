"""A client's connections (Channels): one gRPC channel per server address, with the client's credentials, keepalive
and message limits, and what every call sends along: the bearer token (metadata) and the default deadline.

Channels is the transport interface between the Client and the code that calls the server beside it: the
shared-memory regions (orthoserve.shm, orthoserve.cuda_ipc) open their SharedMemory stubs here and take the deadline
and metadata of their calls from here, and import nothing of orthoserve.client.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import grpc

from orthoserve import retry as retry_lib
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

__all__ = ["Channels", "Reachability", "credentials", "channel_options", "DEFAULT_KEEPALIVE_TIME",
           "DEFAULT_KEEPALIVE_TIMEOUT", "NEVER_CONNECTED_PATIENCE"]

# HTTP/2 keepalive of every channel (seconds): a ping after this long without one while calls are in flight, and the
# connection is dropped (its calls fail with UNAVAILABLE, which is retried) when the ping is not answered within
# DEFAULT_KEEPALIVE_TIMEOUT: a server rank that stopped (SIGSTOP, a frozen node) is noticed within 15 s, about the
# fleet's peer timeout, and the call is retried elsewhere. orthoserve servers accept pings every second
# (--grpc-min-client-ping-interval); a server with gRPC's default enforcement (one ping in 5 minutes) would count these
# as "strikes" and close the connection with GOAWAY "too_many_pings" (retried; gRPC then doubles the interval for that
# channel): pass keepalive_time=300 for such servers. Pings are not sent on idle channels.
DEFAULT_KEEPALIVE_TIME = 10.0
DEFAULT_KEEPALIVE_TIMEOUT = 5.0
# How long (seconds) the calls of a client none of whose channels has ever connected retry UNAVAILABLE (see
# Reachability): a wrong address, a server that is not running or a TLS mismatch is then one clear error after about
# this long, not the retry policy's whole deadline (120 s) of warnings.
NEVER_CONNECTED_PATIENCE = 10.0
# Our messages are at most one chunk plus a few bytes; allow generous room for unary calls.
_MAX_MESSAGE_BYTES = 1 << 30

Metadata = Tuple[Tuple[str, str], ...]


def _read(value: Union[None, bytes, str]) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def credentials(tls: Any) -> Optional[grpc.ChannelCredentials]:
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


def channel_options(keepalive_time: Optional[float], keepalive_timeout: float,
                    retry: retry_lib.RetryPolicy) -> List[tuple]:
    """The options of a channel: message limits, keepalive (None: no pings) and reconnect backoff within `retry`."""
    opts = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES)]
    if keepalive_time is not None:
        opts += [("grpc.keepalive_time_ms", max(1, int(keepalive_time * 1000))),
                 ("grpc.keepalive_timeout_ms", max(1, int(keepalive_timeout * 1000))),
                 # Newer gRPC cores (grpcio 1.85 here) end an unanswered keepalive ping only after this, which
                 # defaults to a minute: keep it the keepalive timeout.
                 ("grpc.http2.ping_timeout_ms", max(1, int(keepalive_timeout * 1000))),
                 ("grpc.keepalive_permit_without_calls", 0),
                 # A long step (a rendezvous, a large batch) may send nothing for minutes: keep pinging through
                 # it (gRPC otherwise stops after two pings without data, and a dead peer goes unnoticed).
                 ("grpc.http2.max_pings_without_data", 0),
                 # Keepalive guards an established connection only: a connection attempt to a server that
                 # accepts TCP but does not answer (a stopped process) would otherwise hold the calls waiting
                 # for it for gRPC's 20 s minimum connect timeout. Give it up as keepalive would.
                 ("grpc.min_reconnect_backoff_ms", max(1, int((keepalive_time + keepalive_timeout) * 1000)))]
    if retry.enabled:
        # A channel whose server went away reconnects with gRPC's own backoff (up to 120 s by default), and
        # calls fail at once with UNAVAILABLE until it does; keep it within the retry policy's waits, so a
        # restarted rank is used again soon after it is back.
        opts += [("grpc.initial_reconnect_backoff_ms", max(100, int(retry.initial_backoff * 1000))),
                 ("grpc.max_reconnect_backoff_ms", max(100, int(retry.max_backoff * 1000)))]
    return opts


class Reachability:
    """Whether any channel of a client has ever connected to its server (gRPC's READY: TCP, and TLS where used, came
    up), and since when calls have failed while none has. Until one connects, a retry policy stops retrying
    UNAVAILABLE once `patience` seconds have passed since the first such failure (retry.Attempts.back_off), and from
    then on each call makes one attempt: a client that cannot reach any server fails fast on every call (and a
    `fallback` that computes locally pays no retry wait), until a channel connects. Thread-safe."""

    def __init__(self, patience: float = NEVER_CONNECTED_PATIENCE):
        self.patience = patience
        self._lock = threading.Lock()
        self._ever = False
        self._since: Optional[float] = None  # The first failure while none had connected (monotonic seconds).

    def connected(self) -> None:
        with self._lock:
            self._ever = True

    def ever_connected(self) -> bool:
        with self._lock:
            return self._ever

    def gave_up(self, now: float) -> bool:
        """After a call failed with UNAVAILABLE at `now`: True when no channel has ever connected and the first such
        failure was `patience` seconds ago or more (the clock starts at the first)."""
        with self._lock:
            if self._ever:
                return False
            if self._since is None:
                self._since = now
            return now - self._since >= self.patience


class Channels:
    """One gRPC channel per server address (made on first use), and the metadata and default deadline of the calls
    made on them. Thread-safe.

    Args:
      credentials: None for plaintext, else the channel credentials (see `credentials`).
      options: returns the options of a new channel (see `channel_options`); asked when a channel is made.
      token: bearer token sent as "authorization: Bearer <token>" (metadata) on every call; None for none.
      timeout: the default deadline of a call's attempt, seconds (None: no deadline); see `deadline`.
    """

    def __init__(self, credentials: Optional[grpc.ChannelCredentials], options: Callable[[], List[tuple]],
                 token: Optional[str], timeout: Optional[float]):
        self.timeout = timeout
        self.metadata: Metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = credentials
        self._options = options
        self._lock = threading.Lock()
        self._channels: Dict[str, grpc.Channel] = {}  # Guarded by _lock, and the stubs on them.
        self._stubs: Dict[str, pb_grpc.OrthogonalizerStub] = {}
        self.reachability = Reachability()  # Whether any of these channels has ever connected.

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        if state == grpc.ChannelConnectivity.READY:
            self.reachability.connected()

    def deadline(self, timeout: Optional[float]) -> Optional[float]:
        """The deadline of a call given `timeout`: `timeout`, or the default when it is None."""
        return self.timeout if timeout is None else timeout

    def stub(self, address: str) -> pb_grpc.OrthogonalizerStub:
        """The Orthogonalizer stub on the channel to `address` (the channel is made on first use)."""
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                opts = self._options()
                if self._credentials is None:
                    channel = grpc.insecure_channel(address, options=opts)
                else:
                    channel = grpc.secure_channel(address, self._credentials, options=opts)
                self._channels[address] = channel
                channel.subscribe(self._on_connectivity, try_to_connect=False)
                stub = self._stubs[address] = pb_grpc.OrthogonalizerStub(channel)
            return stub

    def channel(self, address: str) -> grpc.Channel:
        """The channel to `address` (made on first use)."""
        self.stub(address)
        with self._lock:
            return self._channels[address]

    def shared_memory(self, address: str) -> pb_grpc.SharedMemoryStub:
        """A SharedMemory stub on the channel to `address` (the service that registers regions)."""
        return pb_grpc.SharedMemoryStub(self.channel(address))

    def close(self) -> None:
        """Closes every channel; a later call makes a new one."""
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()
