"""The host side of orthoserve.optax: the matrices of every Request of one step sent to the service in one call
(Client.orthogonalize_batch), and the results put back in the operands' shapes. Runs on the host, with numpy arrays:
directly when the step is not traced, else inside the JAX host callback (orthoserve.optax.callback).

The options of each matrix (the wire's NsOptions; docs/numerics.md, "optax"): precision "highest" (fp32 throughout),
scale_mode "none" (optax scales the result itself, in scale_by_shape), the coefficients as a custom list (optax's
values in its dtype) and
  - a direct request (Request.eps set): optax's eps with eps_mode "add", transpose "auto"; its (batch, rows, cols)
    operand is one matrix of nd "batch";
  - a prescaled request (Request.eps None): every (rows, cols) matrix y of the batch on its own, with eps 0 (the
    server divides by n = fp32(‖y‖_F), its double-precision norm rounded once, as computed here), custom coefficients
    (a, b·n², c·n⁴), extra_scale n and transpose "off" (the client transposed): n · NS_(a, b·n², c·n⁴)(y / n) =
    NS_(a, b, c)(y), the iteration optax runs on y.
Under jax.vmap (the callback's vmap_method "broadcast_all"), every operand carries the mapped axes in front; each
mapped element is sent as its own matrices, all in the same call.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orthoserve.client import Client
from orthoserve.optax.defaults import client_or_default

__all__ = ["Static", "orthogonalize", "direct_options", "prescaled_options", "fit_name", "NAME_BYTES"]

# Matrix names are cut to this many bytes (a prefix and a hash of the whole name): every server's default limit
# (--max-name-bytes, 1024) is far above it.
NAME_BYTES = 64


@dataclasses.dataclass(frozen=True)
class Static:
    """The parts of a Request that are known when the step is traced (orthoserve.optax.requests.Request)."""

    name: str
    steps: int
    eps: Optional[float]


def fit_name(name: str) -> str:
    """`name` when it has at most NAME_BYTES bytes in UTF-8; else a prefix of it, "~" and 16 hex digits of its
    sha256 (the same name always gives the same result)."""
    data = name.encode()
    if len(data) <= NAME_BYTES:
        return name
    suffix = "~" + hashlib.sha256(data).hexdigest()[:16]
    return data[:NAME_BYTES - len(suffix)].decode("utf-8", errors="ignore") + suffix


def _triples(coeffs: np.ndarray, steps: int) -> List[Tuple[float, float, float]]:
    return [] if steps == 0 else [tuple(float(v) for v in t) for t in coeffs]


def direct_options(name: str, coeffs: np.ndarray, steps: int, eps: float) -> Dict[str, Any]:
    """The options of a direct request's (batch, rows, cols) operand: optax's NS on each matrix."""
    out: Dict[str, Any] = dict(name=name, nd="batch", steps=steps, precision="highest", eps=eps, eps_mode="add",
                               transpose="auto", scale_mode="none", extra_scale=1.0)
    triples = _triples(coeffs, steps)
    if triples:
        out["custom_coefficients"] = triples
    return out


def prescaled_options(name: str, y: np.ndarray, coeffs: np.ndarray, steps: int) -> Dict[str, Any]:
    """The options that make the server's NS of the wide matrix y (which it normalizes) optax's iteration on y
    itself (which optax does not normalize): see the module's docstring."""
    # The server's divisor: the sum of squares in double, its square root rounded once to fp32.
    n = float(np.float32(np.sqrt(np.sum(np.square(y, dtype=np.float64)))))
    out: Dict[str, Any] = dict(name=name, steps=steps, precision="highest", eps=0.0, eps_mode="max",
                               transpose="off", scale_mode="none", extra_scale=n)
    triples = [(a, b * n * n, c * n ** 4) for a, b, c in _triples(coeffs, steps)]
    if triples:
        out["custom_coefficients"] = triples
    return out


def orthogonalize(client: Optional[Client], statics: Sequence[Static], *arrays: Any) -> List[np.ndarray]:
    """The service's results for the operands of `statics` (arrays: operand 0, coeffs 0, operand 1, coeffs 1, ...):
    float32 arrays of the operands' shapes. One call for all of them; raises orthoserve.OrthoserveError (its subclass
    for the code) when the call or a matrix fails, RuntimeError when no server is configured (client None and no
    default)."""
    if len(arrays) != 2 * len(statics):
        raise ValueError(f"orthoserve.optax: {len(statics)} requests but {len(arrays)} arrays")
    matrices: List[np.ndarray] = []
    options: List[Dict[str, Any]] = []
    places: List[Tuple[int, int, Optional[int]]] = []  # (request, mapped element, matrix of the batch or None)
    outs: List[np.ndarray] = []
    for i, st in enumerate(statics):
        y = np.ascontiguousarray(arrays[2 * i], dtype=np.float32)
        coeffs = np.asarray(arrays[2 * i + 1], dtype=np.float64)
        outs.append(np.zeros(y.shape, np.float32))
        if y.size == 0:
            continue  # No matrix, or matrices with no elements: nothing to orthogonalize.
        ys = y.reshape((-1,) + y.shape[-3:])
        cs = coeffs.reshape((-1,) + coeffs.shape[-2:])
        for element in range(ys.shape[0]):
            base = st.name if ys.shape[0] == 1 else f"{st.name}@{element}"
            if st.eps is not None:
                matrices.append(ys[element])
                options.append(direct_options(fit_name(base), cs[element], st.steps, st.eps))
                places.append((i, element, None))
                continue
            for b in range(ys.shape[1]):
                name = base if ys.shape[1] == 1 else f"{base}[{b}]"
                matrices.append(ys[element, b])
                options.append(prescaled_options(fit_name(name), ys[element, b], cs[element], st.steps))
                places.append((i, element, b))
    if matrices:
        results = client_or_default(client).orthogonalize_batch(matrices, options)
        for (i, element, b), result in zip(places, results):
            view = outs[i].reshape((-1,) + outs[i].shape[-3:])
            if b is None:
                view[element] = result
            else:
                view[element, b] = result
    return outs
