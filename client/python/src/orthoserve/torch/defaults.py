"""Which server orthoserve.torch uses: the `client` argument where there is one; otherwise the default client, set by
set_default_client(...), or else one made from the environment: ORTHOSERVE_ADDRESS (HOST:PORT, or several,
comma-separated, in failover order) and ORTHOSERVE_TOKEN (a bearer token, optional). And the RegionTransport that
newton_schulz uses with each client (region_transport)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

from orthoserve.client import Client
from orthoserve.region_transport import RegionTransport

__all__ = ["set_default_client", "get_default_client", "client_or_default", "region_transport", "ENV_ADDRESS",
           "ENV_TOKEN"]

ENV_ADDRESS = "ORTHOSERVE_ADDRESS"
ENV_TOKEN = "ORTHOSERVE_TOKEN"

_default_lock = threading.Lock()
_default_client: Optional[Client] = None
# Clients made from the environment, by (pid, address, token): a forked child makes its own (gRPC channels do
# not survive a fork).
_env_clients: Dict[Tuple[int, str, Optional[str]], Client] = {}


def set_default_client(client: Any) -> None:
    """Sets the client that newton_schulz, and RemoteNewtonSchulz and Muon made without one, use: an
    orthoserve.Client, an address ("HOST:PORT") or a list of addresses (a Client with default settings is made),
    or None to go back to the environment (ORTHOSERVE_ADDRESS)."""
    global _default_client
    if client is not None and not isinstance(client, Client):
        if isinstance(client, str) or (isinstance(client, (list, tuple)) and all(isinstance(a, str) for a in client)):
            client = Client(client)
        else:
            raise TypeError(f"orthoserve.torch.set_default_client: expected an orthoserve.Client, an address or a "
                            f"list of addresses, or None; got {type(client).__name__}")
    with _default_lock:
        _default_client = client


def get_default_client() -> Client:
    """The client set by set_default_client, else one for $ORTHOSERVE_ADDRESS (comma-separated addresses) with
    $ORTHOSERVE_TOKEN as its bearer token (made once per process and address). RuntimeError when neither is set."""
    with _default_lock:
        if _default_client is not None:
            return _default_client
        address = os.environ.get(ENV_ADDRESS, "").strip()
        if not address:
            raise RuntimeError(
                "orthoserve.torch: no orthoserve server configured: call "
                "orthoserve.torch.set_default_client(orthoserve.Client('HOST:PORT')) or set the environment "
                f"variable {ENV_ADDRESS}=HOST:PORT (several: comma-separated; {ENV_TOKEN} for a bearer token)")
        token = os.environ.get(ENV_TOKEN) or None
        key = (os.getpid(), address, token)
        client = _env_clients.get(key)
        if client is None:
            addresses = [a.strip() for a in address.split(",") if a.strip()]
            client = _env_clients[key] = Client(addresses, token=token)
        return client


def client_or_default(client: Optional[Client]) -> Client:
    """`client`, or get_default_client() when it is None."""
    return client if client is not None else get_default_client()


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
