"""optax's own muon code with its Newton–Schulz, and only that, computed by the service.

optax 0.2.8's scale_by_muon looks up `orthogonalize_via_newton_schulz` in its module's globals at each update, and
muon looks up `scale_by_muon` there when it is built. rebind() copies such a function with those global names bound
to other objects — optax's module is never modified, so optax.contrib.muon itself keeps working in the same process —
and check_lookups() verifies, at import, that the installed optax's functions still look those names up (otherwise
NS would silently run locally).

One remote call per step (remote_update): the rebound update runs twice within the same step. The first pass records
every NS call's input (orthoserve.optax.requests.prepare; the recorder returns its input unchanged and the pass's
outputs are dropped), then all of them go to the service in one call (orthoserve.optax.callback), then the second
pass returns those results, in the same order, to the same optax code. Both passes compute the same values from the
same inputs; under jax.jit the first pass's dropped outputs are dead code that XLA removes, and eagerly it costs
optax's elementwise work once more (not the NS).
"""

from __future__ import annotations

import contextvars
import types
from typing import Any, Callable, Iterator, List, Optional

import jax
from optax.contrib import _muon as optax_muon

from orthoserve.client import Client
from orthoserve.optax import callback, requests

__all__ = ["rebind", "check_lookups", "remote_update", "ns_hook", "leaf_names"]


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def check_lookups(fn: Callable, *names: str) -> None:
    """ImportError unless `fn` (or a function nested in it) looks up each global name of `names`."""
    missing = [n for n in names if n not in set(_code_names(fn.__code__))]
    if missing:
        import optax

        raise ImportError(f"orthoserve.optax: optax {optax.__version__}'s {fn.__qualname__} no longer looks up "
                          f"{missing}; orthoserve.optax supports optax 0.2.8 (client/python/requirements-jax.txt)")


def rebind(fn: Callable, **names: Any) -> Callable:
    """A copy of function `fn` whose global `names` are bound to the given objects (its other globals are those of
    its module, as they are now); the functions it defines when called inherit those globals."""
    namespace = dict(fn.__globals__)
    namespace.update(names)
    out = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    out.__doc__, out.__qualname__, out.__module__ = fn.__doc__, fn.__qualname__, fn.__module__
    out.__annotations__ = dict(fn.__annotations__)
    return out


# The pass of remote_update in progress in this context (thread, task): called for every NS of optax's code.
_active: contextvars.ContextVar[Optional[Callable[..., Any]]] = contextvars.ContextVar("orthoserve_optax_ns",
                                                                                      default=None)


def ns_hook(x: Any, ns_coeffs: Any, ns_steps: Any = 5, preconditioning: str = "frobenius", eps: Any = 1e-8,
            dimension_numbers: Any = None) -> Any:
    """What optax's rebound scale_by_muon calls in place of orthogonalize_via_newton_schulz (the same parameters):
    the current pass of remote_update. RuntimeError outside one (the rebound function is only run by it)."""
    current = _active.get()
    if current is None:
        raise RuntimeError("orthoserve.optax: the rebound optax NS was called outside remote_update")
    return current(x, ns_coeffs, ns_steps, preconditioning, eps, dimension_numbers)


def leaf_names(tree: Any) -> List[str]:
    """The pytree paths of `tree`'s leaves (jax.tree_util.keystr: "['layer']['w']"), in flatten order."""
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


class _Recorder:
    """Pass 1: prepares each NS call's request and returns its input unchanged."""

    def __init__(self, names: List[str]):
        self.names = names
        self.requests: List[requests.Request] = []

    def __call__(self, x: Any, *args: Any) -> Any:
        k = len(self.requests)
        name = self.names[k] if k < len(self.names) else f"m{k}"
        self.requests.append(requests.prepare(x, *args, name=name))
        return x


class _Replayer:
    """Pass 2: returns the results in the order pass 1 saw the NS calls."""

    def __init__(self, results: List[Any]):
        self.results = results
        self.used = 0

    def __call__(self, x: Any, *args: Any) -> Any:
        if self.used >= len(self.results):
            raise RuntimeError("orthoserve.optax: optax's update made more NS calls than in its first pass")
        result = self.results[self.used]
        self.used += 1
        if result.shape != x.shape or result.dtype != x.dtype:
            raise RuntimeError(f"orthoserve.optax: NS call {self.used - 1} of the second pass has {x.shape} "
                               f"{x.dtype}, the first had {result.shape} {result.dtype}")
        return result


def _run(pass_: Callable[..., Any], update: Callable, *args: Any) -> Any:
    token = _active.set(pass_)
    try:
        return update(*args)
    finally:
        _active.reset(token)


def remote_update(update: Callable, client: Optional[Client], updates: Any, state: Any, params: Any = None) -> Any:
    """update(updates, state, params) — an update function built by a rebound scale_by_muon — with every NS it makes
    computed by the service in one call (the module's docstring). Raises what update and
    orthoserve.optax.callback.orthogonalize raise."""
    recorder = _Recorder(leaf_names(updates))
    _run(recorder, update, updates, state, params)
    results = callback.orthogonalize(recorder.requests, client)
    replayer = _Replayer(results)
    out = _run(replayer, update, updates, state, params)
    if replayer.used != len(results):
        raise RuntimeError(f"orthoserve.optax: optax's update made {replayer.used} NS calls in its second pass, "
                           f"{len(results)} in its first")
    return out


check_lookups(optax_muon.scale_by_muon, "orthogonalize_via_newton_schulz")
check_lookups(optax_muon.muon, "scale_by_muon")
