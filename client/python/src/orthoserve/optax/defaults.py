"""Which server orthoserve.optax uses, by orthoserve.torch's rule: the `client` argument where one is given; otherwise
the module's default client, set by set_default_client(...), or else one made from the environment:
ORTHOSERVE_ADDRESS (HOST:PORT, or several, comma-separated, in failover order) and ORTHOSERVE_TOKEN (a bearer token,
optional). The default is looked up at each step (each host callback), not when the optimizer is made.

orthoserve.optax keeps its own default (orthoserve.torch.set_default_client does not set it): this module imports
neither torch nor orthoserve.torch."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

from orthoserve.client import Client

__all__ = ["set_default_client", "get_default_client", "client_or_default", "ENV_ADDRESS", "ENV_TOKEN"]

ENV_ADDRESS = "ORTHOSERVE_ADDRESS"
ENV_TOKEN = "ORTHOSERVE_TOKEN"

_lock = threading.Lock()
_default: Optional[Client] = None
# Clients made from the environment, by (pid, address, token): a forked child makes its own (gRPC channels do not
# survive a fork).
_env_clients: Dict[Tuple[int, str, Optional[str]], Client] = {}


def set_default_client(client: Any) -> None:
    """Sets the client that muon, scale_by_muon and orthogonalize_via_newton_schulz use when made without one: an
    orthoserve.Client, an address ("HOST:PORT") or a list of addresses (a Client with default settings is made), or
    None to go back to the environment (ORTHOSERVE_ADDRESS). TypeError for anything else."""
    global _default
    if client is not None and not isinstance(client, Client):
        if isinstance(client, str) or (isinstance(client, (list, tuple)) and all(isinstance(a, str) for a in client)):
            client = Client(client)
        else:
            raise TypeError(f"orthoserve.optax.set_default_client: expected an orthoserve.Client, an address or a "
                            f"list of addresses, or None; got {type(client).__name__}")
    with _lock:
        _default = client


def get_default_client() -> Client:
    """The client set by set_default_client, else one for $ORTHOSERVE_ADDRESS (comma-separated addresses) with
    $ORTHOSERVE_TOKEN as its bearer token (made once per process, address and token). RuntimeError when neither is
    set."""
    with _lock:
        if _default is not None:
            return _default
        address = os.environ.get(ENV_ADDRESS, "").strip()
        if not address:
            raise RuntimeError(
                "orthoserve.optax: no orthoserve server configured: pass client=orthoserve.Client('HOST:PORT'), call "
                "orthoserve.optax.set_default_client('HOST:PORT') or set the environment variable "
                f"{ENV_ADDRESS}=HOST:PORT (several: comma-separated; {ENV_TOKEN} for a bearer token)")
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
