"""A default client per integration (orthoserve.torch, orthoserve.optax), by one rule: the client set with
DefaultClient.set(...), else one made from the environment — ORTHOSERVE_ADDRESS (HOST:PORT, or several,
comma-separated, in failover order) and ORTHOSERVE_TOKEN (a bearer token, optional). Environment clients are made
once per process, address and token, and shared by the integrations (a forked child makes its own: gRPC channels do
not survive a fork). Imports neither torch nor jax."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

from orthoserve.client import Client

__all__ = ["DefaultClient", "ENV_ADDRESS", "ENV_TOKEN"]

ENV_ADDRESS = "ORTHOSERVE_ADDRESS"
ENV_TOKEN = "ORTHOSERVE_TOKEN"

_env_lock = threading.Lock()
_env_clients: Dict[Tuple[int, str, Optional[str]], Client] = {}


def _from_environment(unset_message: str) -> Client:
    address = os.environ.get(ENV_ADDRESS, "").strip()
    if not address:
        raise RuntimeError(unset_message)
    token = os.environ.get(ENV_TOKEN) or None
    key = (os.getpid(), address, token)
    with _env_lock:
        client = _env_clients.get(key)
        if client is None:
            addresses = [a.strip() for a in address.split(",") if a.strip()]
            client = _env_clients[key] = Client(addresses, token=token)
        return client


class DefaultClient:
    """One integration's default client. `owner` names it in errors ("orthoserve.torch"); `how` says, in the
    RuntimeError raised when nothing is configured, how to configure it besides the environment."""

    def __init__(self, owner: str, how: str):
        self._owner = owner
        self._how = how
        self._lock = threading.Lock()
        self._client: Optional[Client] = None

    def set(self, client: Any) -> None:
        """An orthoserve.Client, an address ("HOST:PORT") or a list of addresses (a Client with default settings is
        made), or None to go back to the environment. TypeError for anything else."""
        if client is not None and not isinstance(client, Client):
            if isinstance(client, str) or (isinstance(client, (list, tuple)) and
                                           all(isinstance(a, str) for a in client)):
                client = Client(client)
            else:
                raise TypeError(f"{self._owner}.set_default_client: expected an orthoserve.Client, an address or a "
                                f"list of addresses, or None; got {type(client).__name__}")
        with self._lock:
            self._client = client

    def get(self) -> Client:
        """The client set, else the environment's. RuntimeError when neither is there."""
        with self._lock:
            if self._client is not None:
                return self._client
        return _from_environment(
            f"{self._owner}: no orthoserve server configured: {self._how} or set the environment variable "
            f"{ENV_ADDRESS}=HOST:PORT (several: comma-separated; {ENV_TOKEN} for a bearer token)")

    def client_or_default(self, client: Optional[Client]) -> Client:
        """`client`, or get() when it is None."""
        return client if client is not None else self.get()
