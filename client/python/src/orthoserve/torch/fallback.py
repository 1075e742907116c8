"""The local fallback of orthoserve.torch (fallback=True of RemoteNewtonSchulz and Muon): when the service stays
unreachable, the same numerics computed on the trainer (orthoserve.local_ns), with a warning."""

from __future__ import annotations

import logging
import warnings
from typing import Any, Dict

import torch

from orthoserve import errors, local_ns, options as options_lib

__all__ = ["falls_back", "local"]

logger = logging.getLogger("orthoserve")


def falls_back(enabled: bool, error: errors.OrthoserveError, what: str, stacklevel: int = 3) -> bool:
    """Whether to compute `what` locally after `error`: fallback is on and the service stays unreachable (a
    retryable failure that outlasted the client's retries). Warns (at `stacklevel`, as warnings.warn counts it from
    here) and logs when it does."""
    if not (enabled and error.retryable):
        return False
    message = f"orthoserve: {what} failed ({error}); computing it locally on the trainer (fallback=True)"
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)
    logger.warning("%s", message)
    return True


def local(tensor: torch.Tensor, opts: Dict[str, Any], nd: str = "flatten") -> torch.Tensor:
    """The server's result for whole `tensor`, computed here (orthoserve.local_ns); nd as Client.orthogonalize."""
    ns = options_lib.split_options(opts)
    if nd == "batch" and tensor.dim() >= 3:
        matrices = tensor.reshape(-1, *tensor.shape[-2:])
        if matrices.shape[0] == 0:
            return torch.empty_like(tensor)
        return torch.stack([local_ns.orthogonalize(t, **ns) for t in matrices]).reshape(tensor.shape)
    return local_ns.orthogonalize(tensor, **ns)
