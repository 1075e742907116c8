"""Remote results against Emerging-Optimizers' newton_schulz and get_muon_scale_factor (fp32 "highest": max abs
error <= 1e-5), for every coefficient type EO has, every scale mode, the dtypes, N-d shapes, chunked transfers,
and the server's errors."""

import math
import zlib

import grpc
import numpy as np
import pytest
import torch

import orthoserve
import oracle

TOL = 1e-5


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


def test_server_info(client):
    info = client.info()
    assert info.backend == "cpu" and info.fleet_world == 1 and info.ready
    assert info.limits.chunk_bytes > 0


@pytest.mark.parametrize("coefficient_type", oracle.COEFFICIENT_TYPES)
@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (32, 32)])
def test_every_coefficient_type_matches_emerging_optimizers(client, coefficient_type, shape):
    x = rand(*shape, seed=zlib.crc32(repr((coefficient_type, shape)).encode()) % 1000)
    custom = oracle.CUSTOM if coefficient_type == "custom" else None
    for steps in (5, 11):  # 11 runs past every list: cycle vs repeat-last
        ref = oracle.newton_schulz(x, steps=steps, coefficient_type=coefficient_type, custom=custom)
        out = client.orthogonalize([x], coefficients=coefficient_type, custom_coefficients=custom, steps=steps,
                                   precision="highest", scale_mode="none")[0]
        assert out.dtype == torch.float32 and out.shape == x.shape
        assert max_err(out, ref) <= TOL, (coefficient_type, shape, steps)


@pytest.mark.parametrize("scale_mode", oracle.SCALE_MODES)
@pytest.mark.parametrize("shape", [(16, 48), (48, 16)])
def test_scale_modes_match_emerging_optimizers(client, scale_mode, shape):
    x = rand(*shape, seed=3)
    ref = oracle.scaled(x, scale_mode, extra=0.2)
    out = client.orthogonalize([x], precision="highest", scale_mode=scale_mode, extra_scale=0.2)[0]
    assert max_err(out, ref) <= TOL


def test_batch_of_mixed_shapes_in_one_stream(client):
    xs = [rand(8, 20, seed=1), rand(30, 12, seed=2), rand(16, 16, seed=3), rand(5, 64, seed=4)]
    outs = client.orthogonalize(xs, precision="highest", scale_mode="spectral")
    for x, out in zip(xs, outs):
        assert max_err(out, oracle.scaled(x, "spectral")) <= TOL


def test_numpy_in_numpy_out(client):
    x = rand(20, 12, seed=5)
    out = client.orthogonalize([x.numpy()], precision="highest", scale_mode="none")[0]
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert max_err(torch.from_numpy(out), oracle.newton_schulz(x)) <= TOL


def test_nd_is_viewed_as_rows_by_rest(client):
    x = rand(8, 3, 5, seed=6)
    out_nd = client.orthogonalize([x], precision="highest")[0]
    out_2d = client.orthogonalize([x.reshape(8, 15)], precision="highest")[0]
    assert out_nd.shape == x.shape
    assert torch.equal(out_nd.reshape(8, 15), out_2d)
    assert max_err(out_nd, oracle.scaled(x, "spectral")) <= TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_come_back_in_their_dtype(client, dtype):
    x = rand(24, 40, seed=7, dtype=dtype)
    out = client.orthogonalize([x], precision="highest", scale_mode="none")[0]
    assert out.dtype == dtype and out.shape == x.shape
    ref = oracle.newton_schulz(x.float())
    # The result is the fp32 result rounded once to the half type.
    assert max_err(out, ref) <= ref.abs().max().item() * 2 ** -7


def test_large_matrix_is_chunked_both_ways(client):
    chunk = client.info().limits.chunk_bytes
    rows = 256
    cols = chunk // (4 * rows) * 2 + 3  # about 2 chunks of fp32 in each direction
    x = rand(rows, cols, seed=8)
    out = client.orthogonalize([x], precision="highest", steps=2, scale_mode="none")[0]
    assert out.shape == x.shape
    assert max_err(out, oracle.newton_schulz(x, steps=2)) <= TOL


def test_stream_and_unary_agree(client):
    x = rand(12, 20, seed=9)
    assert torch.equal(client.orthogonalize([x], method="unary")[0], client.orthogonalize([x])[0])


def test_zero_steps_returns_the_normalized_input(client):
    x = rand(10, 6, seed=10)
    out = client.orthogonalize([x], steps=0, precision="highest", scale_mode="none")[0]
    assert max_err(out, x / x.norm()) <= TOL


def test_scale_invariance(client):
    x = rand(12, 30, seed=11)
    a, b = client.orthogonalize([x, 37.5 * x], precision="highest")
    assert max_err(a, b) <= TOL


def test_remote_newton_schulz_callable(client):
    from orthoserve.torch import RemoteNewtonSchulz

    ns = RemoteNewtonSchulz(client, coefficients="polar_express", steps=6)
    x = rand(18, 30, seed=12)
    with oracle.matmul_precision("highest"):
        out = ns(x)  # follows torch's matmul precision, as EO's newton_schulz
    assert max_err(out, oracle.newton_schulz(x, steps=6, coefficient_type="polar_express")) <= TOL


def test_medium_precision_tracks_emerging_optimizers_bf16_path(client):
    x = rand(32, 48, seed=13)
    ref = oracle.newton_schulz(x, precision="medium")
    out = client.orthogonalize([x], precision="medium", scale_mode="none")[0]
    # Both round every product to bf16; they may differ by the order of fp32 accumulation before rounding.
    assert max_err(out, ref) <= 4 * 2 ** -8 * ref.abs().max().item()


def test_bad_steps_is_invalid_argument(client):
    with pytest.raises(orthoserve.InvalidArgumentError) as err:
        client.orthogonalize([rand(4, 4)], steps=101)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "steps" in str(err.value)


def test_non_finite_values_are_invalid_argument(client):
    x = rand(4, 6)
    x[1, 2] = math.nan
    with pytest.raises(orthoserve.InvalidArgumentError) as err:
        client.orthogonalize([rand(4, 4), x])
    assert "m1" in str(err.value)
