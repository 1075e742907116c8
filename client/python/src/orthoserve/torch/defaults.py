"""Which server orthoserve.torch uses: the `client` argument where there is one; otherwise the default client, set by
set_default_client(...), or else one made from the environment: ORTHOSERVE_ADDRESS (HOST:PORT, or several,
comma-separated, in failover order) and ORTHOSERVE_TOKEN (a bearer token, optional). And the RegionTransport that
newton_schulz uses with each client (region_transport)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

from orthoserve.client import Client
from orthoserve.default_clients import ENV_ADDRESS, ENV_TOKEN, DefaultClient
from orthoserve.region_transport import RegionTransport

__all__ = ["set_default_client", "get_default_client", "client_or_default", "region_transport", "ENV_ADDRESS",
           "ENV_TOKEN"]

_default = DefaultClient("orthoserve.torch", "call orthoserve.torch.set_default_client(orthoserve.Client('HOST:PORT'))")
_default_lock = threading.Lock()


def set_default_client(client: Any) -> None:
    """Sets the client that newton_schulz, and RemoteNewtonSchulz and Muon made without one, use: an
    orthoserve.Client, an address ("HOST:PORT") or a list of addresses (a Client with default settings is made),
    or None to go back to the environment (ORTHOSERVE_ADDRESS)."""
    _default.set(client)


def get_default_client() -> Client:
    """The client set by set_default_client, else one for $ORTHOSERVE_ADDRESS (comma-separated addresses) with
    $ORTHOSERVE_TOKEN as its bearer token (made once per process and address). RuntimeError when neither is set."""
    return _default.get()


def client_or_default(client: Optional[Client]) -> Client:
    """`client`, or get_default_client() when it is None."""
    return _default.client_or_default(client)


# The transports of newton_schulz, one per client (its regions are reused by the calls that go through that client,
# with and without tp_group).
_transports: "weakref.WeakKeyDictionary[Client, RegionTransport]" = weakref.WeakKeyDictionary()


def region_transport(client: Optional[Client] = None) -> RegionTransport:
    """The RegionTransport that newton_schulz uses with `client` (default: get_default_client()): its `transport`
    ("shm" or "bytes") and `reason` say how the last call went. Made on first use with shm=$ORTHOSERVE_SHM
    ("auto" when unset)."""
    client = client_or_default(client)
    with _default_lock:
        transport = _transports.get(client)
        if transport is None:
            transport = _transports[client] = RegionTransport(None, what="orthoserve.torch.newton_schulz")
        return transport
