"""N-d input: Client.orthogonalize(nd="batch") sends an N-d array as one matrix with MatrixSpec.nd_layout =
ND_LAYOUT_BATCH (prod(shape[:-2]) independent shape[-2] x shape[-1] matrices) and gets the result in the input's
shape; nd="flatten" (the default) keeps the service's shape[0] x prod(rest) view; RemoteNewtonSchulz treats
(B, M, N) as B matrices exactly as Emerging-Optimizers' newton_schulz does, and rejects the dims EO rejects with
EO's exception type."""

import grpc
import numpy as np
import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers import muon_utils

import oracle
from orthoserve.torch import RemoteNewtonSchulz
from fake_server import FakeServer
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

TOL = 1e-5  # As the other EO comparisons (test_numerics.py): fp32 "highest", max abs error.


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("shape", [(4, 24, 40), (3, 40, 24), (2, 16, 16), (1, 8, 12)])
@pytest.mark.parametrize("coefficient_type", ["quintic", "polar_express", "simple"])
def test_remote_newton_schulz_batches_3d_as_emerging_optimizers(client, shape, coefficient_type):
    x = rand(*shape, seed=sum(shape))
    ns = RemoteNewtonSchulz(client, coefficients=coefficient_type, steps=5)
    with oracle.matmul_precision("highest"):
        out = ns(x)
        ref = muon_utils.newton_schulz(x, steps=5, coefficient_type=coefficient_type)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert max_err(out, ref) <= TOL
    # The flattened view is a different computation (the bug this guards against).
    flat = client.orthogonalize([x], coefficients=coefficient_type, precision="highest", scale_mode="none")[0]
    if shape[0] > 1:
        assert max_err(flat, ref) > 1e-2


def test_remote_newton_schulz_3d_medium_tracks_emerging_optimizers(client):
    x = rand(3, 32, 48, seed=5)
    ns = RemoteNewtonSchulz(client)
    with oracle.matmul_precision("medium"):
        out = ns(x)
        ref = muon_utils.newton_schulz(x, steps=5)
    assert max_err(out, ref) <= 4 * 2 ** -8 * ref.abs().max().item()


@pytest.mark.parametrize("shape", [(7,), (2, 3, 4, 5)])
def test_remote_newton_schulz_rejects_what_emerging_optimizers_rejects(client, shape):
    x = rand(*shape)
    with pytest.raises(TypeError) as theirs:
        muon_utils.newton_schulz(x, steps=5)
    with pytest.raises(TypeError) as ours:
        RemoteNewtonSchulz(client)(x)
    assert str(ours.value) == str(theirs.value)


def test_batch_mode_is_each_slice_alone(client):
    x = rand(3, 10, 6, seed=7)
    batched = client.orthogonalize([x], nd="batch", precision="highest")[0]
    singles = client.orthogonalize([x[i] for i in range(3)], precision="highest")
    assert batched.shape == x.shape
    assert torch.equal(batched, torch.stack(singles))
    # numpy in, numpy out, and a 4-D array: prod(shape[:-2]) = 8 matrices of 3 x 5.
    y = rand(2, 4, 3, 5, seed=8).numpy()
    out = client.orthogonalize(y, nd="batch", precision="highest")
    assert isinstance(out, np.ndarray) and out.shape == y.shape
    for i in range(2):
        for j in range(4):
            ref = client.orthogonalize(y[i, j], precision="highest")
            assert np.array_equal(out[i, j], ref)
    # The unary call takes the same layout.
    assert torch.equal(client.orthogonalize([x], nd="batch", precision="highest", method="unary")[0], batched)


def test_flatten_is_the_default_and_unchanged(client):
    x = rand(4, 6, 5, seed=9)
    default = client.orthogonalize([x], precision="highest")[0]
    flat = client.orthogonalize([x], nd="flatten", precision="highest")[0]
    two_d = client.orthogonalize([x.reshape(4, 30)], precision="highest")[0]
    assert torch.equal(default, flat) and torch.equal(flat.reshape(4, 30), two_d)
    assert max_err(flat, oracle.scaled(x, "spectral")) <= TOL


def test_a_server_that_ignores_the_batch_layout_is_refused():
    # A server older than MatrixSpec.nd_layout would answer for the flattened matrix, silently: the
    # client checks the echo and raises instead of returning that as the batch's result.
    fake = FakeServer()
    fake.servicer.echo_nd_layout = False
    try:
        import orthoserve

        a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        with orthoserve.Client(fake.address) as client:
            for method in ("stream", "unary"):
                with pytest.raises(orthoserve.OrthoserveError) as e:
                    client.orthogonalize([a], nd="batch", method=method)
                assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and e.value.matrix == "m0", method
                assert "nd_layout" in str(e.value)
            # Flattened tensors (what such a server does compute) are returned as before.
            [flat] = client.orthogonalize([a])
            assert np.array_equal(flat, a)
    finally:
        fake.stop()


def test_batch_mode_on_the_wire():
    fake = FakeServer()
    try:
        import orthoserve

        a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        b = np.ones((2, 5), np.float32)
        empty = np.zeros((0, 3, 4), np.float32)
        with orthoserve.Client(fake.address) as client:
            ra, rb, re = client.orthogonalize_batch([a, b, empty], [dict(name="a"), {}, {}], nd="batch")
            assert np.array_equal(ra, a) and np.array_equal(rb, b) and re.shape == (0, 3, 4)
            with pytest.raises(ValueError):
                client.orthogonalize([a], nd="stack")
        [messages] = fake.servicer.streams  # The empty batch (no matrices) was not sent.
        specs = [m.spec for m in messages if m.WhichOneof("kind") == "spec"]
        assert [(s.name, list(s.shape), s.nd_layout) for s in specs] == [
            ("a", [2, 3, 4], pb.ND_LAYOUT_BATCH), ("m1", [2, 5], pb.ND_LAYOUT_UNSPECIFIED)]
    finally:
        fake.stop()


def test_group_step_with_the_batch_layout(client):
    """Two trainer ranks each hold two of the four matrices of a (4, 6, 8) batch: row blocks of its 2-D view
    prod(shape[:-1]) x shape[-1] = 24 x 8 (Shard(nd="batch")); together they get the lone client's result."""
    import threading
    import uuid

    import orthoserve

    x = rand(4, 6, 8, seed=12)
    whole = client.orthogonalize([x], nd="batch", precision="highest")[0]
    results, errors = [None, None], []
    run_id = f"test-nd-batch-{uuid.uuid4().hex}"  # Both trainer ranks are one run.

    def trainer(rank):
        try:
            shard = orthoserve.Shard("x", x.shape, (12 * rank, 0), x[2 * rank:2 * rank + 2], nd="batch",
                                     precision="highest")
            assert shard.block == (12, 8)
            [results[rank]] = client.group("test-nd-batch", "g", rank, 2, run_id=run_id).step(0, [shard])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert torch.equal(torch.cat(results), whole)
    with pytest.raises(ValueError, match="does not fit"):  # Checked against the batch view, not the flat one.
        orthoserve.Shard("x", x.shape, (0, 8), x[:2], nd="batch")
