"""JAX / optax integration: optax.contrib.muon with its Newton–Schulz computed by the service.

    from orthoserve.optax import muon        # in place of: from optax.contrib import muon
    opt = muon(learning_rate=0.02)           # optax's arguments, order and defaults; client= (keyword) is the one extra

`muon`, `scale_by_muon` and `orthogonalize_via_newton_schulz` have optax 0.2.8's signatures plus a keyword-only
`client` at the end, and are optax's own code (its momentum, Nesterov, bias correction, weight decay and mask, shape
scaling, the AdamW branch for the non-Muon parameters, the MuonState) with only the Newton–Schulz sent to the service:
all the matrices of one update in one call, through a JAX host callback (jax.pure_callback), so the update works
under jax.jit, lax.scan and jax.vmap (orthoserve.optax.steps, .callback). How optax's NS options map to the wire
(coefficients, ns_steps, eps as eps_mode "add", transposition, precision "highest", and the preconditionings and
complex dtypes the wire has no option for): orthoserve.optax.requests, orthoserve.optax.host and docs/numerics.md.

Which server: the `client` argument; else the default client, set by set_default_client(...), or else made from
$ORTHOSERVE_ADDRESS (and $ORTHOSERVE_TOKEN), looked up at each update (orthoserve.optax.defaults).
Errors: a failed call is never replaced by a local computation. An eager (untraced) update raises the
orthoserve.OrthoserveError (its subclass for the code); a traced one (jax.jit, ...) raises jax.errors.JaxRuntimeError
whose message ends with that error's class and text.

Needs jax and optax 0.2.8 (client/python/requirements-jax.txt; `scripts/setup_python.sh --with-jax`); the orthoserve
client itself does not.
"""

# This package's directory is named optax: if the orthoserve package directory itself were on sys.path (a script run
# from inside it), `import optax` would find this package instead of optax. Say so instead of failing obscurely.
if __name__ != "orthoserve.optax":  # pragma: no cover - exercised by tests/python/test_optax_dropin.py
    raise ImportError(f"orthoserve.optax was imported as {__name__!r}: the directory of the orthoserve package is on "
                      "sys.path (a script run from inside it?); run from elsewhere so that `import optax` finds optax")

try:
    import jax  # noqa: F401
    import optax  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by the client-only install test
    raise ImportError("orthoserve.optax needs jax and optax 0.2.8, which are not installed (the orthoserve client "
                      "itself does not): pip install 'optax==0.2.8', or the package's extra: "
                      "pip install 'orthoserve[optax]'") from e

from optax.contrib import MuonDimensionNumbers, MuonState  # noqa: E402  (re-exported: an import swap keeps them)

from orthoserve.optax.defaults import (ENV_ADDRESS, ENV_TOKEN, get_default_client,  # noqa: E402
                                       set_default_client)
from orthoserve.optax.muon import muon, orthogonalize_via_newton_schulz, scale_by_muon  # noqa: E402

__all__ = ["muon", "scale_by_muon", "orthogonalize_via_newton_schulz", "MuonDimensionNumbers", "MuonState",
           "set_default_client", "get_default_client", "ENV_ADDRESS", "ENV_TOKEN"]
