"""Arrays and tensors become row-major little-endian bytes of their dtype and come back with the same type,
dtype, shape and device."""

import numpy as np
import pytest
import torch

from orthoserve import arrays
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb


@pytest.mark.parametrize("dtype,wire", [(np.float32, pb.DTYPE_FP32), (np.float16, pb.DTYPE_FP16)])
def test_numpy_round_trip(dtype, wire):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4).astype(dtype) / 7
    info = arrays.describe(a, "a")
    assert info.wire_dtype == wire and info.shape == (2, 3, 4)
    raw = arrays.to_bytes(a)
    assert bytes(raw) == a.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    back = arrays.from_bytes(bytearray(raw), info, info.shape)
    assert isinstance(back, np.ndarray) and back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)


def test_numpy_big_endian_is_sent_little_endian():
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    assert bytes(arrays.to_bytes(a)) == np.arange(6, dtype="<f4").tobytes()


def test_numpy_non_contiguous():
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T
    assert bytes(arrays.to_bytes(a)) == np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype,wire", [(torch.float32, pb.DTYPE_FP32), (torch.bfloat16, pb.DTYPE_BF16),
                                        (torch.float16, pb.DTYPE_FP16)])
def test_torch_round_trip(dtype, wire):
    t = (torch.randn(3, 5, 2) * 3).to(dtype)
    info = arrays.describe(t, "t")
    assert info.wire_dtype == wire and info.shape == (3, 5, 2)
    raw = arrays.to_bytes(t)
    assert len(raw) == t.numel() * t.element_size()
    back = arrays.from_bytes(bytearray(raw), info, info.shape)
    assert isinstance(back, torch.Tensor) and back.dtype == dtype and back.device == t.device
    assert torch.equal(back, t)


def test_torch_bf16_bytes_are_the_top_halves_of_fp32():
    # Values exactly representable in bf16, so the bf16 bits are the top 16 bits of the fp32 bits.
    t = torch.tensor([[1.0, -2.5], [262144.0, 0.15625]], dtype=torch.float32)
    raw = bytes(arrays.to_bytes(t.to(torch.bfloat16)))
    fp32_bits = np.frombuffer(t.numpy().tobytes(), dtype="<u4")
    assert np.frombuffer(raw, dtype="<u2").tolist() == (fp32_bits >> 16).tolist()


def test_torch_non_contiguous_and_grad():
    t = torch.randn(4, 6, requires_grad=True)
    view = t.t()
    assert bytes(arrays.to_bytes(view)) == view.detach().contiguous().numpy().tobytes()


def test_rejects_other_types_and_dtypes():
    with pytest.raises(TypeError, match="float64"):
        arrays.describe(np.zeros((2, 2)), "x")
    with pytest.raises(TypeError, match="torch.int32"):
        arrays.describe(torch.zeros(2, 2, dtype=torch.int32), "x")
    with pytest.raises(TypeError, match="list"):
        arrays.describe([[1.0]], "x")


def test_matrix_view():
    assert arrays.matrix_view((6, 2, 3)) == (6, 6)
    with pytest.raises(ValueError, match="at least 2 dims"):
        arrays.matrix_view((5,))
