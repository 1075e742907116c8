"""One Newton–Schulz call of optax's muon (optax.contrib._muon.orthogonalize_via_newton_schulz, optax 0.2.8) as a
request to the service: prepare() does in JAX (traceable, optax's own arithmetic) what optax does before its NS loop
that the wire cannot express, and Request.finish() what it does after; the loop itself (and for "frobenius" on real
arrays the normalization and transposition too) is the server's.

Two ways a matrix is sent (docs/numerics.md, "optax"):
  - direct (preconditioning "frobenius", real dtypes): optax's (batch, reduction, output) view, widened to fp32,
    with optax's own options on the wire: x / (‖x‖_F + eps) is eps_mode ADD with optax's eps, transpose auto (optax
    transposes when rows > cols, as the server does), the coefficients as a custom list, scale none.
  - prescaled (preconditioning "spectral", "aol", "schatten", and complex dtypes): the client transposes to wide and
    preconditions as optax does — y = x / (‖x‖₂ + eps), AOL's row scaling, the Schatten-4 rescaling, or
    x / (‖x‖_F + eps) for complex — and a complex y is sent as its real embedding [[Re, −Im], [Im, Re]] (a real NS on
    it is the embedding of the complex NS). Optax iterates on y itself, unnormalized; the server normalizes, so the
    host sends each matrix with eps 0 (X = y / n, n = ‖y‖_F) and folds n back in: NS with (a, b, c) on y equals
    n · NS with (a, b·n², c·n⁴) on y / n, exactly in real arithmetic (orthoserve.optax.host).
Outside the NS, nothing here changes optax's numbers: the result comes back in x's dtype and shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from optax.contrib import _muon as optax_muon

__all__ = ["PRECONDITIONINGS", "PRECONDITION_EPS", "Request", "prepare"]

PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
# optax's AOL and Schatten first steps clip their rescaling at their own default eps, not muon's eps.
PRECONDITION_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class Request:
    """One leaf's matrices, ready for the host call.

    name: the matrix name on the wire (the leaf's pytree path).
    operand: float32 (batch, rows, cols) array sent (traced or concrete).
    coeffs: float32 (k, 3): optax's coefficients, rounded to x's dtype as optax rounds them.
    steps: the NS steps (k is 1 and the triple cycles, or steps == k).
    eps: direct: optax's eps (eps_mode ADD, transpose auto); None: prescaled (orthoserve.optax.host).
    finish: the result (float32, operand's shape) back to x's dtype and shape, as optax returns it.
    """

    name: str
    operand: Any
    coeffs: Any
    steps: int
    eps: Optional[float]
    finish: Callable[[Any], Any]


def _check(x: Any, ns_coeffs: Any, preconditioning: str, dimension_numbers: Any) -> Any:
    """optax's argument checks, with its messages; returns the dimension numbers to use."""
    if x.ndim != 2 and not isinstance(dimension_numbers, optax_muon.MuonDimensionNumbers):
        raise ValueError(
            f'Input must have shape (m, n) or weight dimension numbers must be'
            f' provided. Got shape={x.shape} and {dimension_numbers=}.')
    if x.ndim == 2:
        dimension_numbers = optax_muon.MuonDimensionNumbers(reduction_axis=0, output_axis=1)
    if ns_coeffs.ndim > 2 or ns_coeffs.shape[-1] != 3:
        raise ValueError('Newton-Schulz coefficients must have shape (3,) or'
                         f' (n, 3), got {ns_coeffs.shape}')
    if preconditioning not in PRECONDITIONINGS:
        raise ValueError(f'Unknown preconditioning {preconditioning}')
    return dimension_numbers


def _static_int(value: Any, what: str) -> int:
    try:
        return int(value)
    except jax.errors.ConcretizationTypeError:
        raise TypeError(f"orthoserve.optax: {what} must be known when the step is traced (a Python int), not a "
                        "traced value") from None


def _precondition(w: Any, preconditioning: str, eps: Any, steps: int, complex_: bool) -> Any:
    """What optax's NS applies to the wide (batch, rows <= cols) matrices `w` before its base iterations, in w's
    dtype: frobenius/spectral normalization (always), AOL/Schatten rescaling (part of optax's first step: none when
    steps == 0)."""
    if preconditioning == "frobenius":
        return w / (jnp.linalg.norm(w, ord="fro", axis=(-2, -1), keepdims=True) + eps)
    if preconditioning == "spectral":
        return w / (jnp.linalg.norm(w, ord=2, axis=(-2, -1), keepdims=True) + eps)
    if steps == 0:
        return w
    if preconditioning == "aol":
        a = w @ jnp.conj(jnp.swapaxes(w, -1, -2))
        rescaling = jnp.clip(jnp.abs(a).sum(axis=-1), min=PRECONDITION_EPS)
        return w * jnp.expand_dims(jax.lax.rsqrt(rescaling), -1)
    # schatten: optax's first step uses x·xᵀ (no conjugate), which is a base NS step of the rescaled x only for real
    # x.
    if complex_:
        raise NotImplementedError(
            "orthoserve.optax: preconditioning='schatten' on a complex array is not offered: optax's first Schatten "
            "step uses x·xᵀ without the conjugate, which is not a Newton–Schulz step the service computes; use "
            "another preconditioning, or optax.contrib.muon itself")
    a = w @ jnp.swapaxes(w, -1, -2)
    rescaling = jnp.clip(jnp.linalg.norm(a, ord="fro", axis=(-2, -1)), min=PRECONDITION_EPS)
    return w * jax.lax.rsqrt(rescaling)[..., None, None]


def prepare(x: Any, ns_coeffs: Any, ns_steps: Any, preconditioning: str, eps: Any, dimension_numbers: Any,
            name: str) -> Request:
    """The Request for optax's orthogonalize_via_newton_schulz(x, ns_coeffs, ns_steps, preconditioning, eps,
    dimension_numbers). Raises what optax raises for bad arguments (ValueError), TypeError for a dtype that is neither
    floating nor complex or a traced ns_steps, NotImplementedError for Schatten on complex arrays."""
    x = jnp.asarray(x)
    ns_coeffs = jnp.asarray(ns_coeffs)
    dimension_numbers = _check(x, ns_coeffs, preconditioning, dimension_numbers)
    dtype = x.dtype
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    if not complex_ and not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"orthoserve.optax: Newton–Schulz of a {dtype} array; expected a floating or complex dtype")
    # optax: ns_coeffs.astype(x.dtype); a (3,) triple for ns_steps steps, or (k, 3) for k steps (ns_steps ignored).
    coeffs = ns_coeffs.astype(dtype)
    if coeffs.ndim == 1:
        steps = max(_static_int(ns_steps, "ns_steps"), 0)
        coeffs = coeffs[None]
    else:
        steps = coeffs.shape[0]
    coeffs = jnp.real(coeffs).astype(jnp.float32)

    reshape_fn, inverse_fn = optax_muon._compute_muon_reshape(x, dimension_numbers)
    flat = reshape_fn(x)  # (batch, reduction, output), as optax vmaps its NS over the batch.
    rows, cols = flat.shape[-2:]
    if preconditioning == "frobenius" and not complex_:
        return Request(name, flat.astype(jnp.float32), coeffs, steps, float(eps),
                       lambda z: inverse_fn(z.astype(dtype)))

    transposed = rows > cols
    w = jnp.swapaxes(flat, -1, -2) if transposed else flat
    y = _precondition(w, preconditioning, eps, steps, complex_)
    wide_rows, wide_cols = y.shape[-2:]
    if complex_:
        re, im = jnp.real(y), jnp.imag(y)
        operand = jnp.concatenate([jnp.concatenate([re, -im], axis=-1), jnp.concatenate([im, re], axis=-1)], axis=-2)
    else:
        operand = y
    operand = operand.astype(jnp.float32)

    def finish(z: Any) -> Any:
        if complex_:
            z = jax.lax.complex(z[..., :wide_rows, :wide_cols], z[..., wide_rows:, :wide_cols])
        z = z.astype(dtype)
        if transposed:
            z = jnp.swapaxes(z, -1, -2)
        return inverse_fn(z)

    return Request(name, operand, coeffs, steps, None, finish)
