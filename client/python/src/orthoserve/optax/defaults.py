"""Which server orthoserve.optax uses, by orthoserve.torch's rule: the `client` argument where one is given; otherwise
the module's default client, set by set_default_client(...), or else one made from the environment:
ORTHOSERVE_ADDRESS (HOST:PORT, or several, comma-separated, in failover order) and ORTHOSERVE_TOKEN (a bearer token,
optional). The default is looked up at each step (each host callback), not when the optimizer is made.

orthoserve.optax keeps its own default (orthoserve.torch.set_default_client does not set it): this module imports
neither torch nor orthoserve.torch."""

from __future__ import annotations

from typing import Any, Optional

from orthoserve.client import Client
from orthoserve.default_clients import ENV_ADDRESS, ENV_TOKEN, DefaultClient

__all__ = ["set_default_client", "get_default_client", "client_or_default", "ENV_ADDRESS", "ENV_TOKEN"]

_default = DefaultClient("orthoserve.optax", "pass client=orthoserve.Client('HOST:PORT'), call "
                                             "orthoserve.optax.set_default_client('HOST:PORT')")


def set_default_client(client: Any) -> None:
    """Sets the client that muon, scale_by_muon and orthogonalize_via_newton_schulz use when made without one: an
    orthoserve.Client, an address ("HOST:PORT") or a list of addresses (a Client with default settings is made), or
    None to go back to the environment (ORTHOSERVE_ADDRESS). TypeError for anything else."""
    _default.set(client)


def get_default_client() -> Client:
    """The client set by set_default_client, else one for $ORTHOSERVE_ADDRESS (comma-separated addresses) with
    $ORTHOSERVE_TOKEN as its bearer token (made once per process, address and token). RuntimeError when neither is
    set."""
    return _default.get()


def client_or_default(client: Optional[Client]) -> Client:
    """`client`, or get_default_client() when it is None."""
    return _default.client_or_default(client)
