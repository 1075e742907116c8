"""CUDA IPC regions from Python (orthoserve.cuda_ipc, docs/shared_memory.md): the CUDA_IPC line the module sends,
a cpu server refusing a handle with FAILED_PRECONDITION, and — on a machine with a GPU and torch — a torch tensor's
memory registered with a `--backend cuda` server and computed on in place, bit-identical to the same call with
bytes (skipped without a GPU)."""

import numpy as np
import pytest

import orthoserve
from conftest import start_server
from orthoserve import cuda_ipc
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

UUID = "GPU-e0e1e2e3-e4e5-e6e7-e8e9-eaebecedee00"


def test_the_message_is_one_cuda_ipc_line():
    handle = bytes(range(64))
    line = cuda_ipc.format_message(UUID, 512, 1 << 20, handle)
    assert line == f"CUDA_IPC {UUID} 512 1048576 {handle.hex()}\n".encode()
    with pytest.raises(ValueError):
        cuda_ipc.format_message(UUID, 0, 16, handle[:63])
    with pytest.raises(ValueError):
        cuda_ipc.format_message(UUID, 100, 16, handle)  # Not a multiple of 256.
    with pytest.raises(ValueError):
        cuda_ipc.format_message(UUID, 0, 0, handle)


@pytest.mark.deadline(60)
def test_a_cpu_server_refuses_cuda_ipc_handles(tmp_path):
    socket_path = tmp_path / "shm.sock"
    s = start_server(tmp_path, ["--shm-socket", str(socket_path)], name="shm-cpu")
    try:
        with orthoserve.Client(s.address, timeout=30) as client:
            info = client.info(s.address, refresh=True)
            assert info.shm_socket == str(socket_path)
            assert info.shm_cuda_device == ""
        with pytest.raises(orthoserve.errors.FailedPreconditionError, match="does not open CUDA IPC handles"):
            cuda_ipc.hand_over(str(socket_path), cuda_ipc.format_message(UUID, 0, 1024, bytes(64)))
    finally:
        s.stop()


def _cuda_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.mark.deadline(180)
@pytest.mark.skipif(_cuda_torch() is None, reason="needs torch with a CUDA device")
def test_a_tensors_memory_is_computed_in_place_on_a_cuda_server(tmp_path):
    torch = _cuda_torch()
    socket_path = tmp_path / "shm.sock"
    s = start_server(tmp_path, ["--backend", "cuda", "--shm-socket", str(socket_path)], name="shm-cuda")
    try:
        rows, cols = 256, 384
        buf = torch.zeros(2 * rows * cols * 4, dtype=torch.uint8, device="cuda")
        g = buf[: rows * cols * 4].view(torch.float32).view(rows, cols)
        u = buf[rows * cols * 4:].view(torch.float32).view(rows, cols)
        g.copy_(torch.randn(rows, cols, device="cuda"))
        torch.cuda.synchronize()
        with orthoserve.Client(s.address, timeout=60) as client:
            with cuda_ipc.CudaRegion.of_tensor(client, s.address, buf, name="momenta") as region:
                spec = pb.MatrixSpec(name="w", shape=[rows, cols], dtype=pb.DTYPE_FP32)
                spec.input_region.CopyFrom(region.slice_of(g))
                spec.result_region.CopyFrom(region.slice_of(u))
                stub = pb_grpc.OrthogonalizerStub(client.channels.channel(s.address))
                in_region = stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=spec)]), timeout=60)
                assert in_region.results[0].code == 0, in_region.results[0].message
                assert in_region.results[0].data == b""
                plain = pb.MatrixSpec(name="w", shape=[rows, cols], dtype=pb.DTYPE_FP32)
                data = g.cpu().numpy().tobytes()
                by_bytes = stub.Orthogonalize(pb.OrthogonalizeRequest(matrices=[pb.Matrix(spec=plain, data=data)]),
                                              timeout=60)
                assert u.cpu().numpy().tobytes() == by_bytes.results[0].data
                assert np.isfinite(u.cpu().numpy()).all()
    finally:
        s.stop()
