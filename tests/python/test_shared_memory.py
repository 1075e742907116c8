"""Shared-memory regions end to end (issue #28, docs/shared_memory.md): the real server with --shm-socket and a
token file of two tenants, orthoserve.shm regions made by the client, numpy arrays and torch tensors (fp32, bf16,
fp16) of them used in unary and stream calls. Results through a region are bit-identical to the same call with
bytes; another tenant cannot use a region; a server without --shm-socket refuses regions; slices out of range or
misaligned are refused. orthoserve.torch's automatic use of regions: test_shm_transport.py."""

import os
import socket
import time

import numpy as np
import pytest

import orthoserve
from conftest import start_server
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("shm")
    (d / "tokens").write_text("secret-a alice\nsecret-m mallory\n")
    socket_path = d / "shm.sock"
    s = start_server(d, ["--token-file", str(d / "tokens"), "--shm-socket", str(socket_path)], name="shm",
                     token="secret-a")
    s.socket_path = socket_path
    yield s
    s.stop()
    assert not socket_path.exists(), "the server left its socket behind"


@pytest.mark.deadline(120)
@pytest.mark.parametrize("method", ["unary", "stream"])
def test_results_through_a_region_are_bit_identical_to_bytes(shm_server, method):
    rng = np.random.default_rng(7)
    shapes = [((64, 96), np.float32), ((96, 48), np.float16), ((3, 16, 8), np.float32)]
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=60) as client:
        with client.region(4 << 20, name="momenta") as region:
            inputs, outs, plain = [], [], []
            for shape, dtype in shapes:
                g = region.array(shape, dtype)
                g[...] = rng.standard_normal(shape).astype(dtype)
                inputs.append(g)
                outs.append(region.array(shape, dtype))
                plain.append(np.array(g))  # An ordinary copy: sent as bytes.
            expected = client.orthogonalize(plain, method=method, precision="highest")
            got = client.orthogonalize(inputs, out=outs, method=method, precision="highest")
            for e, g, o in zip(expected, got, outs):
                assert g is o  # The result is the out array, written by the server.
                assert g.dtype == e.dtype and g.shape == e.shape
                assert g.tobytes() == e.tobytes()
            # Input in the region, result as bytes; and the other way round.
            assert client.orthogonalize(inputs[0], method=method, precision="highest").tobytes() == \
                expected[0].tobytes()
            outs[0][...] = 0
            client.orthogonalize(plain[0], out=outs[0], method=method, precision="highest")
            assert outs[0].tobytes() == expected[0].tobytes()


@pytest.mark.deadline(120)
def test_regions_belong_to_their_tenant(shm_server):
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=30) as alice, \
            orthoserve.Client(shm_server.address, token="secret-m", timeout=30, retry=False) as mallory:
        region = alice.region(1 << 20)
        g = region.array((8, 8))
        g[...] = np.eye(8, dtype=np.float32)
        alice.orthogonalize(g, method="unary")
        # Mallory names alice's region by its id (a spec made by hand: mallory's client knows no such region).
        spec = pb.MatrixSpec(name="x", shape=[8, 8], dtype=pb.DTYPE_FP32,
                             input_region=pb.RegionSlice(region_id=region.id, offset=0, size=256))
        stub = mallory._stub(shm_server.address)
        import grpc

        with pytest.raises(grpc.RpcError) as err:
            stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=spec)]), timeout=10,
                               metadata=mallory.channels.metadata)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

        shm_stub = pb_grpc.SharedMemoryStub(mallory.channels.channel(shm_server.address))
        assert list(shm_stub.ListRegions(pb.ListRegionsRequest(), timeout=10,
                                         metadata=mallory.channels.metadata).regions) == []
        mine = shm_stub.ListRegions(pb.ListRegionsRequest(), timeout=10, metadata=alice.channels.metadata).regions
        assert [r.region_id for r in mine] == [region.id]
        region.close()
        # After the owner unregistered it, the owner cannot use it either.
        with pytest.raises(grpc.RpcError) as err:
            stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=spec)]), timeout=10,
                               metadata=alice.channels.metadata)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.deadline(60)
def test_a_region_array_must_fit_and_an_out_array_must_be_in_a_region(shm_server):
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=30) as client:
        with client.region(4096) as region:
            with pytest.raises(ValueError, match="do not fit"):
                region.array((33, 32))  # 4224 bytes.
            with pytest.raises(ValueError, match="do not fit"):
                region.array((2, 2), offset=4096 - 8)
            with pytest.raises(ValueError, match="not a multiple"):
                region.array((2, 2), offset=2)
            g = region.array((4, 4))
            g[...] = np.arange(16, dtype=np.float32).reshape(4, 4)
            with pytest.raises(ValueError, match="not an array of one of this client's open regions"):
                client.orthogonalize(g, out=np.zeros((4, 4), np.float32))
            with pytest.raises(ValueError, match="shape"):
                client.orthogonalize(g, out=region.array((2, 8)))


@pytest.mark.deadline(120)
def test_a_server_without_shm_socket_refuses_regions(tmp_path):
    server = start_server(tmp_path, name="noshm")
    try:
        with orthoserve.Client(server.address, timeout=30) as client:
            assert client.info().shm_socket == ""
            with pytest.raises(orthoserve.FailedPreconditionError, match="--shm-socket"):
                client.region(1 << 20)
    finally:
        server.stop()


@pytest.mark.deadline(60)
def test_the_memfd_is_sealed_against_shrinking(shm_server):
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=30) as client:
        with client.region(1 << 16) as region:
            with pytest.raises(PermissionError):
                os.ftruncate(region._fd, 0)
            g = region.array((16, 16))
            g[...] = np.eye(16, dtype=np.float32)
            assert client.orthogonalize(g, method="unary").shape == (16, 16)


@pytest.mark.deadline(60)
def test_idle_connections_on_the_socket_do_not_delay_a_region(shm_server):
    """Issue #38: 8 local connections that send nothing are held open on --shm-socket; a region made right after
    them (its memfd handed over on that socket) is ready within a second, and the idle ones are answered
    DEADLINE_EXCEEDED and closed at their own deadline."""
    idle = []
    try:
        for _ in range(8):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(str(shm_server.socket_path))
            idle.append(s)
        time.sleep(0.05)  # Accepted (or at least queued) before the region's connection.
        with orthoserve.Client(shm_server.address, token="secret-a", timeout=30) as client:
            start = time.monotonic()
            with client.region(1 << 16) as region:
                took = time.monotonic() - start
                g = region.array((16, 16))
                g[...] = np.eye(16, dtype=np.float32)
                assert client.orthogonalize(g, method="unary").shape == (16, 16)
            assert took < 1.0, f"the region took {took:.2f} s behind 8 idle connections"
        for s in idle:
            assert s.recv(4096).startswith(b"ERR DEADLINE_EXCEEDED no whole hand-over message within 1s")
            assert s.recv(4096) == b""
    finally:
        for s in idle:
            s.close()


# -- torch tensors backed by a region ----------------------------------------------------------------------------

try:
    import torch
except ImportError:  # The numpy tests above still run.
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _bits(t):
    """A tensor's bits, comparable with == (bf16/fp16 as int16, fp32 as int32)."""
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


@needs_torch
@pytest.mark.deadline(120)
@pytest.mark.parametrize("method", ["unary", "stream"])
def test_region_tensors_are_bit_identical_to_bytes(shm_server, method):
    gen = torch.Generator().manual_seed(11)
    shapes = [((64, 96), torch.float32), ((96, 48), torch.bfloat16), ((40, 72), torch.float16),
              ((3, 16, 8), torch.float32)]
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=60) as client:
        with client.region(4 << 20, name="tensors") as region:
            inputs, outs, plain = [], [], []
            for shape, dtype in shapes:
                g = region.tensor(shape, dtype)
                assert g.dtype == dtype and tuple(g.shape) == shape and g.is_contiguous()
                g.copy_(torch.randn(shape, generator=gen))
                inputs.append(g)
                outs.append(region.tensor(shape, dtype))
                plain.append(g.clone())  # An ordinary tensor: sent as bytes.
            # A numpy array of the same region in the same call.
            a = region.array((32, 16), np.float32)
            a[...] = np.random.default_rng(3).standard_normal((32, 16))
            expected = client.orthogonalize(plain + [np.array(a)], method=method, precision="highest")
            got = client.orthogonalize(inputs + [a], out=outs + [region.array((32, 16), np.float32)], method=method,
                                       precision="highest")
            for e, g, o in zip(expected, got, outs):
                assert g is o  # The result is the out tensor, written by the server.
                assert g.dtype == e.dtype and g.shape == e.shape
                assert torch.equal(_bits(g), _bits(e))
            assert got[-1].tobytes() == expected[-1].tobytes()
            # Input in the region, result as bytes (a new tensor); and bytes in, result in the region.
            assert torch.equal(_bits(client.orthogonalize(inputs[1], method=method, precision="highest")),
                               _bits(expected[1]))
            outs[2].zero_()
            client.orthogonalize(plain[2], out=outs[2], method=method, precision="highest")
            assert torch.equal(_bits(outs[2]), _bits(expected[2]))
            # A contiguous part of a region tensor names its own slice.
            rows = inputs[0][16:48]
            assert region.slice_of(rows).offset == region.slice_of(inputs[0]).offset + 16 * 96 * 4
            assert torch.equal(_bits(client.orthogonalize(rows, method=method, precision="highest")),
                               _bits(client.orthogonalize(rows.clone(), method=method, precision="highest")))


@needs_torch
@pytest.mark.deadline(60)
def test_region_tensor_misuse_is_refused(shm_server):
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=30) as client:
        region = client.region(4096)
        with pytest.raises(ValueError, match="do not fit"):
            region.tensor((33, 32))  # 4224 bytes.
        with pytest.raises(ValueError, match="do not fit"):
            region.tensor((2, 2), torch.bfloat16, offset=4096 - 6)
        with pytest.raises(ValueError, match="not a multiple"):
            region.tensor((2, 2), torch.float32, offset=2)
        with pytest.raises(ValueError, match="negative"):
            region.tensor((2, -2))
        with pytest.raises(TypeError, match="float32, torch.bfloat16 or torch.float16"):
            region.tensor((2, 2), torch.float64)
        g = region.tensor((8, 4))
        g.copy_(torch.arange(32, dtype=torch.float32).reshape(8, 4))
        # An out tensor must be a contiguous tensor of one of the client's regions, of the result's shape and dtype.
        with pytest.raises(ValueError, match="not an array of one of this client's open regions"):
            client.orthogonalize(g, out=torch.zeros(8, 4))
        with pytest.raises(ValueError, match="not an array of one of this client's open regions"):
            client.orthogonalize(g, out=region.tensor((4, 8)).T)  # Not contiguous.
        with pytest.raises(ValueError, match="dtype"):
            client.orthogonalize(g, out=region.tensor((8, 4), torch.float16))
        with pytest.raises(ValueError, match="shape"):
            client.orthogonalize(g, out=region.tensor((4, 8)))
        # A non-contiguous view of the region is not in it: it goes as bytes, with the same result.
        assert region.slice_of(g.T) is None
        assert torch.equal(client.orthogonalize(g.T, precision="highest"),
                           client.orthogonalize(g.T.contiguous(), precision="highest"))
        region.close()
        with pytest.raises(ValueError, match="closed"):
            region.tensor((2, 2))
        assert region.slice_of(g) is None  # A closed region holds nothing; g goes as bytes.
        assert client.orthogonalize(g, method="unary").shape == (8, 4)


@needs_torch
@pytest.mark.deadline(60)
def test_the_server_refuses_bf16_slices_out_of_range_or_misaligned(shm_server):
    import grpc

    with orthoserve.Client(shm_server.address, token="secret-a", timeout=30) as client:
        with client.region(4096) as region:
            stub = client._stub(shm_server.address)

            def call(offset, size):
                spec = pb.MatrixSpec(name="x", shape=[8, 8], dtype=pb.DTYPE_BF16,
                                     input_region=pb.RegionSlice(region_id=region.id, offset=offset, size=size))
                stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=spec)]), timeout=10,
                                   metadata=client.channels.metadata)

            region.tensor((8, 8), torch.bfloat16).copy_(torch.eye(8))
            call(0, 128)  # In range: accepted.
            for offset, size, code in ((4096 - 64, 128, grpc.StatusCode.OUT_OF_RANGE),
                                       (2**63 - 64, 128, grpc.StatusCode.OUT_OF_RANGE),
                                       (1, 128, grpc.StatusCode.INVALID_ARGUMENT),
                                       (0, 127, grpc.StatusCode.INVALID_ARGUMENT)):
                with pytest.raises(grpc.RpcError) as err:
                    call(offset, size)
                assert err.value.code() == code, (offset, size, err.value.details())


@pytest.mark.deadline(180)
@pytest.mark.parametrize("method", ["unary", "stream"])
def test_an_abandoned_calls_late_result_never_lands_in_the_next_calls_out(shm_server, method):
    # A call whose out array is in a region runs past its deadline (1536^2, 12 iterations: seconds of compute, a
    # 0.3 s timeout, no retries). The caller then makes its next call into the same array. Unfenced, the abandoned
    # computation landed there afterwards, over the next call's OK result; the client fences the failed attempt
    # (orthoserve.fences) before it raises, so the array holds the next call's result for good.
    rng = np.random.default_rng(38)
    big = rng.standard_normal((1536, 1536)).astype(np.float32)
    small = rng.standard_normal((1536, 1536)).astype(np.float32)
    with orthoserve.Client(shm_server.address, token="secret-a", timeout=60) as client:
        expected = client.orthogonalize(small, method=method, steps=1)
        with client.region(4 * big.nbytes, name="reused-out") as region:
            g = region.array(big.shape, big.dtype)
            g[...] = big
            out = region.array(big.shape, big.dtype)
            with pytest.raises(orthoserve.DeadlineExceededError):
                client.orthogonalize_batch([g], [{"steps": 12}], out=[out], method=method, timeout=0.3, retry=False)
            got = client.orthogonalize(small, out=out, method=method, steps=1)
            assert got is out and out.tobytes() == expected.tobytes()
            time.sleep(6.0)  # Longer than the abandoned computation takes here (about 2.5 s).
            assert out.tobytes() == expected.tobytes(), "the abandoned call's result landed in the next call's out"
