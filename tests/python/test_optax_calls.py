"""orthoserve.optax's calls to the service: one call per update for all its matrices (eager, under jax.jit, and under
jax.vmap), the leaves' pytree paths as the matrix names, errors that surface as the documented exceptions (never a
local fallback), and the choice of the server (client=, set_default_client, $ORTHOSERVE_ADDRESS)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import orthoserve
import orthoserve.optax as oo
from conftest import free_port


class CountingClient(orthoserve.Client):
    """A Client that records the matrix names of each orthogonalize_batch call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def orthogonalize_batch(self, matrices, options, **kwargs):
        self.calls.append([o.get("name") for o in options])
        return super().orthogonalize_batch(matrices, options, **kwargs)


def params():
    rng = np.random.default_rng(0)
    return {"attn": {"q": rng.standard_normal((16, 32)).astype(np.float32),
                     "o": rng.standard_normal((32, 16)).astype(np.float32)},
            "mlp": [rng.standard_normal((24, 24)).astype(np.float32)],
            "norm": np.ones(16, np.float32)}


@pytest.mark.deadline(120)
@pytest.mark.parametrize("preconditioning", ["frobenius", "aol"])
def test_one_call_per_update_named_by_pytree_paths(server, preconditioning):
    client = CountingClient(server.address)
    try:
        opt = oo.muon(0.02, preconditioning=preconditioning, client=client)
        p = params()
        state = opt.init(p)
        _, state = opt.update(p, state, p)  # Eager: one call.
        step = jax.jit(lambda g, s: opt.update(g, s, g))
        for _ in range(3):  # Traced: one call per execution (the trace itself makes none).
            _, state = step(p, state)
        jax.block_until_ready(state)
        assert len(client.calls) == 4
        # The Muon leaves only ("norm" is 1-D: optax's AdamW), one matrix each (2-D leaves), in flatten order.
        assert client.calls[0] == ["['attn']['o']", "['attn']['q']", "['mlp'][0]"], client.calls[0]
        assert all(c == client.calls[0] for c in client.calls)

        # jax.vmap over three models: still one call per update, with each model's matrices in it.
        stacked = jax.tree.map(lambda x: np.stack([x, 2 * x, -x]), p)
        update = jax.jit(jax.vmap(lambda g, s: opt.update(g, s, g)))
        update(stacked, jax.vmap(opt.init)(stacked))[0]["mlp"][0].block_until_ready()
        assert len(client.calls) == 5
        assert client.calls[-1] == [f"{name}@{m}" for name in client.calls[0] for m in range(3)], client.calls[-1]
    finally:
        client.close()


@pytest.mark.deadline(60)
def test_a_server_error_names_the_leaf_eagerly_and_under_jit(client):
    opt = oo.muon(0.02, ns_steps=101, client=client)  # The service takes 0..100 steps.
    p = {"w": np.ones((8, 12), np.float32)}
    state = opt.init(p)
    with pytest.raises(orthoserve.InvalidArgumentError, match=r"matrix '\['w'\]'.*steps") as eager:
        opt.update(p, state, p)
    assert eager.value.matrix == "['w']"
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"InvalidArgumentError: INVALID_ARGUMENT: matrix '\['w'\]'"):
        jax.block_until_ready(jax.jit(lambda g, s: opt.update(g, s, g))(p, state))
    # A non-finite momentum is the service's INVALID_ARGUMENT too (optax would return NaN updates).
    bad = {"w": np.full((8, 12), np.nan, np.float32)}
    with pytest.raises(orthoserve.InvalidArgumentError, match="non-finite"):
        oo.muon(0.02, client=client).update(bad, state, bad)


@pytest.mark.deadline(60)
def test_an_unreachable_server_is_an_error_not_a_local_computation():
    client = orthoserve.Client(f"127.0.0.1:{free_port()}", retry=False, timeout=5)
    try:
        opt = oo.muon(0.02, client=client)
        p = {"w": np.ones((8, 12), np.float32)}
        state = opt.init(p)
        with pytest.raises(orthoserve.UnavailableError):
            opt.update(p, state, p)
        with pytest.raises(jax.errors.JaxRuntimeError, match="UnavailableError: UNAVAILABLE"):
            jax.block_until_ready(jax.jit(lambda g, s: opt.update(g, s, g))(p, state))
        with pytest.raises(orthoserve.UnavailableError):
            oo.orthogonalize_via_newton_schulz(p["w"], jnp.array([3.4445, -4.7750, 2.0315]), client=client)
    finally:
        client.close()


@pytest.mark.deadline(60)
def test_the_default_client_comes_from_set_default_client_or_the_environment(server, monkeypatch):
    p = {"w": np.random.default_rng(1).standard_normal((8, 12)).astype(np.float32)}
    expected, _ = optax.contrib.muon(0.02).update(p, optax.contrib.muon(0.02).init(p), p)
    opt = oo.muon(0.02)  # No client: looked up at each update.
    state = opt.init(p)
    monkeypatch.delenv(oo.ENV_ADDRESS, raising=False)
    oo.set_default_client(None)
    with pytest.raises(RuntimeError, match="no orthoserve server configured"):
        opt.update(p, state, p)
    monkeypatch.setenv(oo.ENV_ADDRESS, f"127.0.0.1:{free_port()},{server.address}")  # Fails over to the second.
    got, _ = opt.update(p, state, p)
    np.testing.assert_allclose(got["w"], expected["w"], rtol=1e-5, atol=1e-7)
    assert oo.get_default_client().addresses[1] == server.address
    monkeypatch.delenv(oo.ENV_ADDRESS)
    try:
        oo.set_default_client(server.address)
        got, _ = jax.jit(lambda g, s: opt.update(g, s, g))(p, state)
        np.testing.assert_allclose(got["w"], expected["w"], rtol=1e-5, atol=1e-7)
        with pytest.raises(TypeError):
            oo.set_default_client(42)
    finally:
        oo.get_default_client().close()
        oo.set_default_client(None)
