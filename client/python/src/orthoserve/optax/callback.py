"""The requests of one step through the service from JAX: one host call for all of them (orthoserve.optax.host).

When every operand is concrete (an eager, untraced step) the host function runs directly, and a failure raises the
orthoserve.OrthoserveError itself. When the step is traced (jax.jit, lax.scan, jax.vmap, ...) it runs as one
jax.pure_callback whose results are float32 arrays of the operands' shapes; jax raises a failure inside a callback as
jax.errors.JaxRuntimeError, whose message ends with the OrthoserveError's class and text
("orthoserve.errors.UnavailableError: UNAVAILABLE: ..."). Under jax.vmap the callback is called once per mapped
call with the mapped axes in front of every operand (vmap_method "broadcast_all"). The callback is not
differentiable (no JVP rule): as optax's NS is, the update may not be differentiated through.
"""

from __future__ import annotations

import functools
from typing import Any, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from orthoserve.client import Client
from orthoserve.optax import host
from orthoserve.optax.requests import Request

__all__ = ["orthogonalize", "is_traced"]


def is_traced(values: Sequence[Any]) -> bool:
    """Whether any of `values` is a JAX tracer (the step is being traced, not run eagerly)."""
    return any(isinstance(v, jax.core.Tracer) for v in values)


def orthogonalize(requests: Sequence[Request], client: Optional[Client]) -> List[Any]:
    """The NS results of `requests`, each in its x's dtype and shape (Request.finish), from one call to the service
    (client None: orthoserve.optax.get_default_client() when the call runs). Raises as the module's docstring says."""
    if not requests:
        return []
    statics = tuple(host.Static(r.name, r.steps, r.eps) for r in requests)
    operands = [a for r in requests for a in (r.operand, r.coeffs)]
    call = functools.partial(host.orthogonalize, client, statics)
    if is_traced(operands):
        shapes = [jax.ShapeDtypeStruct(r.operand.shape, jnp.float32) for r in requests]
        results = jax.pure_callback(call, shapes, *operands, vmap_method="broadcast_all")
    else:
        results = [jnp.asarray(r) for r in call(*[np.asarray(a) for a in operands])]
    return [r.finish(z) for r, z in zip(requests, results)]
