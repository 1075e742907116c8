"""orthoserve.optax's public functions: optax.contrib.muon, scale_by_muon and orthogonalize_via_newton_schulz (optax
0.2.8) with optax's parameters, positional order, defaults and annotations, and one more keyword-only parameter at the
end, `client`; their Newton–Schulz is computed by the service, everything else by optax's own code
(orthoserve.optax.steps).

The annotations are optax's objects (this module does not use `from __future__ import annotations`, so that
inspect.signature compares equal with optax's; tests/python/test_optax_dropin.py checks it).
"""

import functools
from typing import Any, Callable, Literal, Optional, Union

import jax
from optax._src import base
from optax.contrib import _muon as optax_muon

from orthoserve.client import Client
from orthoserve.optax import callback, requests, steps

__all__ = ["muon", "scale_by_muon", "orthogonalize_via_newton_schulz"]

# optax's scale_by_muon with its NS calls going to the current pass of steps.remote_update; and optax's muon as it is
# at import (a test harness may then set optax's module attributes to these functions: tools/optax_plugin.py).
_optax_scale_by_muon = steps.rebind(optax_muon.scale_by_muon, orthogonalize_via_newton_schulz=steps.ns_hook)
_optax_muon = optax_muon.muon


def orthogonalize_via_newton_schulz(
    x: jax.Array,
    ns_coeffs: jax.Array,
    ns_steps: jax.typing.ArrayLike = 5,
    preconditioning: Literal[
        'frobenius', 'spectral', 'aol', 'schatten'
    ] = 'frobenius',
    eps: jax.typing.ArrayLike = 1e-8,
    dimension_numbers: optax_muon.MuonDimensionNumbers | None = None,
    *,
    client: Optional[Client] = None,
) -> jax.Array:
    """optax.contrib._muon.orthogonalize_via_newton_schulz computed by the service, in one call (x's matrices, batch
    axes included). Arguments as optax's; client: an orthoserve.Client, None for orthoserve.optax.get_default_client()
    when the call runs. Raises optax's ValueErrors for bad arguments; a failed call as orthoserve.optax.callback
    says (the OrthoserveError eagerly, jax.errors.JaxRuntimeError carrying it when traced)."""
    request = requests.prepare(x, ns_coeffs, ns_steps, preconditioning, eps, dimension_numbers, name="x")
    [out] = callback.orthogonalize([request], client)
    return out


def scale_by_muon(
    ns_coeffs: Union[
        tuple[jax.typing.ArrayLike, jax.typing.ArrayLike, jax.typing.ArrayLike],
        tuple[
            tuple[
                jax.typing.ArrayLike, jax.typing.ArrayLike, jax.typing.ArrayLike
            ],
            ...,
        ],
    ] = optax_muon._DEFAULT_NS_COEFFS,
    ns_steps: jax.typing.ArrayLike = 5,
    beta: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    mu_dtype: Optional[jax.typing.DTypeLike] = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Literal[
        'frobenius', 'spectral', 'aol', 'schatten'
    ] = 'frobenius',
    weight_dimension_numbers: optax_muon.WeightDimNumOrFn | None = None,
    client: Optional[Client] = None,
) -> base.GradientTransformation:
    """optax.contrib.scale_by_muon, its Newton–Schulz computed by the service: one call per update for all the
    matrices of the update. Arguments, state (optax's MuonState) and every other computation are optax's; client: an
    orthoserve.Client, None for orthoserve.optax.get_default_client() at each update."""
    inner = _optax_scale_by_muon(ns_coeffs, ns_steps, beta, eps, mu_dtype, nesterov=nesterov, adaptive=adaptive,
                                 preconditioning=preconditioning, weight_dimension_numbers=weight_dimension_numbers)

    def update_fn(updates, state, params=None):
        return steps.remote_update(inner.update, client, updates, state, params)

    return base.GradientTransformation(inner.init, update_fn)


def muon(
    learning_rate: base.ScalarOrSchedule,
    ns_coeffs: Union[
        tuple[jax.typing.ArrayLike, jax.typing.ArrayLike, jax.typing.ArrayLike],
        tuple[
            tuple[
                jax.typing.ArrayLike, jax.typing.ArrayLike, jax.typing.ArrayLike
            ],
            ...,
        ],
        str,
    ] = optax_muon._DEFAULT_NS_COEFFS,
    ns_steps: jax.typing.ArrayLike = 5,
    beta: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: Optional[
        Union[Any, Callable[[base.Params], Any]]
    ] = None,
    mu_dtype: Optional[jax.typing.DTypeLike] = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Literal[
        'frobenius', 'spectral', 'aol', 'schatten'
    ] = 'frobenius',
    adam_b1: jax.typing.ArrayLike = 0.9,
    adam_b2: jax.typing.ArrayLike = 0.999,
    adam_eps_root: jax.typing.ArrayLike = 0.0,
    adam_weight_decay: jax.typing.ArrayLike = 0.0,
    adam_learning_rate: base.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: optax_muon.WeightDimNumOrFn | None = None,
    consistent_rms: jax.typing.ArrayLike | None = None,
    client: Optional[Client] = None,
) -> base.GradientTransformation:
    """optax.contrib.muon, its Newton–Schulz computed by the service (an import swap: `from orthoserve.optax import
    muon` for `from optax.contrib import muon`).

    optax's own muon, built by optax's code with orthoserve's scale_by_muon in place of optax's: the partition of
    the parameters (2-D, or per muon_weight_dimension_numbers, to Muon; the others to optax's AdamW), momentum,
    Nesterov, bias correction, the adaptive scaling, scale_by_shape, weight decay and its mask, and the learning rate
    are optax's; the matrices of every update go to the service in one call. Arguments and defaults are optax's
    (see optax.contrib.muon); client: an orthoserve.Client, None for orthoserve.optax.get_default_client() at each
    update (set_default_client, else $ORTHOSERVE_ADDRESS).
    """
    build = steps.rebind(_optax_muon, scale_by_muon=functools.partial(scale_by_muon, client=client))
    return build(learning_rate, ns_coeffs, ns_steps, beta, eps, weight_decay, weight_decay_mask, mu_dtype,
                 nesterov=nesterov, adaptive=adaptive, preconditioning=preconditioning, adam_b1=adam_b1,
                 adam_b2=adam_b2, adam_eps_root=adam_eps_root, adam_weight_decay=adam_weight_decay,
                 adam_learning_rate=adam_learning_rate, muon_weight_dimension_numbers=muon_weight_dimension_numbers,
                 consistent_rms=consistent_rms)
