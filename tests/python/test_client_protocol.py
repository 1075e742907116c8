"""The client's side of OrthogonalizeStream against a recording fake server: message order, chunks no larger
than the advertised limit, reassembly of results that arrive in any order, group headers and blocks, routing
of trainer rank r to fleet rank floor(r*S/W), and errors carrying their code, message and matrix."""

import grpc
import numpy as np
import pytest
import torch

import orthoserve
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from fake_server import FakeServer


@pytest.fixture()
def fake():
    s = FakeServer(chunk_bytes=1000)
    yield s
    s.stop()


def kinds(messages):
    return [m.WhichOneof("kind") for m in messages]


def test_stream_order_chunking_and_reassembly(fake):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((33, 20)).astype(np.float32)          # 2640 bytes: 3 chunks
    b = torch.randn(4, 3, 5).to(torch.bfloat16)                     # N-d, 120 bytes: 1 chunk
    c = rng.standard_normal((2, 2)).astype(np.float16)
    with orthoserve.Client(fake.address, token="s3cret") as client:
        ra, rb, rc = client.orthogonalize([a, b, c], steps=3, precision="highest")
    assert isinstance(ra, np.ndarray) and ra.dtype == np.float32 and np.array_equal(ra, a)
    assert isinstance(rb, torch.Tensor) and rb.dtype == torch.bfloat16 and rb.shape == b.shape and torch.equal(rb, b)
    assert rc.dtype == np.float16 and np.array_equal(rc, c)
    [messages] = fake.servicer.streams
    assert kinds(messages) == ["header", "spec", "chunk", "chunk", "chunk", "spec", "chunk", "spec", "chunk", "end"]
    header = messages[0].header
    assert header.num_matrices == 3 and header.world == 1 and header.job == "" and header.group == ""
    assert header.run_id == ""  # A lone step sends no run id.
    chunks = [m.chunk for m in messages if m.WhichOneof("kind") == "chunk"]
    assert all(len(ch.data) <= 1000 for ch in chunks)
    assert [ch.index for ch in chunks] == [0, 0, 0, 1, 2]
    specs = [m.spec for m in messages if m.WhichOneof("kind") == "spec"]
    assert [list(s.shape) for s in specs] == [[33, 20], [4, 3, 5], [2, 2]]
    assert [s.dtype for s in specs] == [pb.DTYPE_FP32, pb.DTYPE_BF16, pb.DTYPE_FP16]
    assert specs[0].options.steps == 3 and specs[0].options.precision == pb.PRECISION_HIGHEST
    assert specs[0].block == pb.Block()  # whole matrix
    assert fake.servicer.metadata[0]["authorization"] == "Bearer s3cret"


def test_single_array_gives_single_result_and_unary(fake):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with orthoserve.Client(fake.address) as client:
        assert np.array_equal(client.orthogonalize(a), a)
        [u] = client.orthogonalize([a], method="unary")
        assert np.array_equal(u, a)
        assert client.orthogonalize([]) == []


def test_per_matrix_error_names_the_matrix(fake):
    good = np.ones((2, 2), np.float32)
    with orthoserve.Client(fake.address) as client:
        group = client.group("job", "g", 0, 1)
        with pytest.raises(orthoserve.InvalidArgumentError) as err:
            group.step(1, [orthoserve.Shard("ok", (2, 2), (0, 0), good),
                           orthoserve.Shard("bad.qkv", (2, 2), (0, 0), good)])
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.matrix == "bad.qkv"
    assert "block rows out of range" in err.value.message and "bad.qkv" in str(err.value)


def test_stream_status_becomes_coded_exception(fake):
    with orthoserve.Client(fake.address) as client:
        with pytest.raises(orthoserve.AbortedError) as err:
            client.group("abort", "g", 0, 2, run_id="run-1").step(3, [orthoserve.Shard("w", (4, 2), (0, 0), np.ones((2, 2), np.float32))])
    assert err.value.code == grpc.StatusCode.ABORTED
    assert err.value.message == "step 3 of group g aborted: trainer ranks [1] missing"
    assert isinstance(err.value, orthoserve.OrthoserveError)


def test_deadline(fake):
    # One attempt (an attempt that runs out of its timeout is otherwise retried: test_timeouts.py).
    with orthoserve.Client(fake.address, timeout=0.3, retry=False) as client:
        with pytest.raises(orthoserve.DeadlineExceededError):
            client.group("slow", "g", 0, 1).step(1, [orthoserve.Shard("w", (2, 2), (0, 0), np.ones((2, 2), np.float32))])


def test_connection_refused_is_unavailable():
    with orthoserve.Client("127.0.0.1:1", timeout=5, retry=False) as client:
        with pytest.raises(orthoserve.UnavailableError):
            client.info()


@pytest.mark.parametrize("world,fleet", [(4, 2), (3, 2), (2, 3), (5, 1)])
def test_group_routes_rank_r_to_fleet_rank_floor_r_s_over_w(world, fleet):
    servers = [FakeServer(chunk_bytes=64, fleet_rank=i) for i in range(fleet)]
    try:
        members = [pb.FleetMember(rank=i, address=s.address, ready=True) for i, s in enumerate(servers)]
        for s in servers:
            s.servicer.members = members
        shape = (2 * world + 1, 6)
        blocks = orthoserve.chunk_blocks(shape, world, 0)
        full = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
        for rank in range(world):
            with orthoserve.Client(servers[0].address) as client:
                group = client.group("job", "tp", rank, world, run_id="run-7")
                (r0, c0), (rows, cols) = blocks[rank]
                block = full[r0:r0 + rows, c0:c0 + cols]
                [out] = group.step(7, [orthoserve.Shard("w", shape, (r0, c0), block, algorithm="row_sharded")])
                assert np.array_equal(out, block) and out.shape == block.shape
                assert group.address == servers[rank * fleet // world].address
        for i, s in enumerate(servers):
            ranks = sorted(m[0].header.rank for m in s.servicer.streams)
            assert ranks == [r for r in range(world) if r * fleet // world == i]
            for messages in s.servicer.streams:
                h = messages[0].header
                assert (h.job, h.group, h.step, h.world, h.num_matrices) == ("job", "tp", 7, world, 1)
                assert h.run_id == "run-7"
                spec = messages[1].spec
                (r0, c0), (rows, cols) = blocks[h.rank]
                assert spec.block == pb.Block(row_offset=r0, col_offset=c0, rows=rows, cols=cols)
                assert spec.algorithm == pb.ALGORITHM_ROW_SHARDED and list(spec.shape) == list(shape)
                assert all(len(m.chunk.data) <= 64 for m in messages if m.WhichOneof("kind") == "chunk")
    finally:
        for s in servers:
            s.stop()
