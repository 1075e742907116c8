"""Shared-memory regions end to end (issue #28, docs/shared_memory.md): the real server with --shm-socket and a
token file of two tenants, orthoserve.shm regions made by the client, arrays of them used in unary and stream calls.
Results through a region are bit-identical to the same call with bytes; another tenant cannot use a region; a
server without --shm-socket refuses regions."""

import os

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
                               metadata=mallory._metadata)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

        shm_stub = pb_grpc.SharedMemoryStub(mallory._channel(shm_server.address))
        assert list(shm_stub.ListRegions(pb.ListRegionsRequest(), timeout=10, metadata=mallory._metadata).regions) == []
        mine = shm_stub.ListRegions(pb.ListRegionsRequest(), timeout=10, metadata=alice._metadata).regions
        assert [r.region_id for r in mine] == [region.id]
        region.close()
        # After the owner unregistered it, the owner cannot use it either.
        with pytest.raises(grpc.RpcError) as err:
            stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=spec)]), timeout=10,
                               metadata=alice._metadata)
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
