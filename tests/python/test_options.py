"""NS options by name map onto the wire's NsOptions; bad names and values are rejected up front."""

import pytest

from orthoserve import options
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb


def test_unset_options_leave_server_defaults():
    o = options.ns_options({})
    assert o == pb.NsOptions()
    assert not o.HasField("steps") and not o.HasField("eps") and not o.HasField("extra_scale")


def test_every_option_maps_to_its_field():
    o = options.ns_options(dict(coefficients="polar_express", steps=7, precision="highest", eps=1e-15,
                                eps_mode="add", transpose=False, scale_mode="unit_rms_norm", extra_scale=0.2,
                                split_qkv=[4, 2, 2]))
    assert o.coefficients == pb.COEFFICIENTS_POLAR_EXPRESS
    assert o.steps == 7 and o.HasField("steps")
    assert o.precision == pb.PRECISION_HIGHEST
    assert o.eps == 1e-15 and o.eps_mode == pb.EPS_MODE_ADD
    assert o.transpose == pb.TRANSPOSE_OFF
    assert o.scale_mode == pb.SCALE_MODE_UNIT_RMS_NORM
    assert o.extra_scale == pytest.approx(0.2)
    assert list(o.split_qkv) == [4, 2, 2]


def test_zero_steps_is_sent_explicitly():
    o = options.ns_options(dict(steps=0))
    assert o.HasField("steps") and o.steps == 0


@pytest.mark.parametrize("value,expected", [(True, pb.TRANSPOSE_ON), ("on", pb.TRANSPOSE_ON),
                                            ("auto", pb.TRANSPOSE_AUTO), ("OFF", pb.TRANSPOSE_OFF)])
def test_transpose_values(value, expected):
    assert options.ns_options(dict(transpose=value)).transpose == expected


def test_custom_coefficients_imply_custom():
    o = options.ns_options(dict(custom_coefficients=[(1.5, -0.5, 0.0), (3, -3.2, 1.2)]))
    assert o.coefficients == pb.COEFFICIENTS_CUSTOM
    assert [(t.a, t.b, t.c) for t in o.custom_coefficients] == [(1.5, -0.5, 0.0), (3.0, -3.2, 1.2)]


def test_every_coefficient_name_is_known():
    for name in ["simple", "quintic", "polar_express", "aol", "cans", "deepseekv4", "cubic5", "custom"]:
        assert options.ns_options(dict(coefficients=name)).coefficients == options.COEFFICIENTS[name]


def test_unknown_option_name():
    with pytest.raises(TypeError, match="unknown option.*'stepz'"):
        options.ns_options(dict(stepz=3))


@pytest.mark.parametrize("name,value", [("coefficients", "septic"), ("precision", "low"),
                                        ("scale_mode", "rms"), ("eps_mode", "mul")])
def test_unknown_values(name, value):
    with pytest.raises(ValueError, match=f"unknown {name} '{value}'"):
        options.ns_options({name: value})


def test_split_qkv_needs_three_sizes():
    with pytest.raises(ValueError, match="split_qkv must be"):
        options.ns_options(dict(split_qkv=[1, 2]))


def test_algorithms():
    assert options.algorithm_value(None) == pb.ALGORITHM_AUTO
    assert options.algorithm_value("tp_distributed") == pb.ALGORITHM_TP_DISTRIBUTED
    with pytest.raises(ValueError, match="unknown algorithm"):
        options.algorithm_value("ring")


def test_base_client_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, orthoserve; orthoserve.Client('127.0.0.1:1'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
