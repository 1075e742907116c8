"""Newton–Schulz options by name, converted to the wire's NsOptions / MatrixSpec fields (the NsOptions message and
its enums in proto/orthoserve/v1/orthogonalizer.proto; the arithmetic in docs/numerics.md)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

__all__ = ["OPTION_NAMES", "ns_options", "algorithm_value", "COEFFICIENTS", "PRECISIONS", "SCALE_MODES",
           "ALGORITHMS", "NORMALIZATIONS", "asks_bf16_normalization"]

COEFFICIENTS = {
    "simple": pb.COEFFICIENTS_SIMPLE,
    "quintic": pb.COEFFICIENTS_QUINTIC,
    "polar_express": pb.COEFFICIENTS_POLAR_EXPRESS,
    "aol": pb.COEFFICIENTS_AOL,
    "cans": pb.COEFFICIENTS_CANS,
    "deepseekv4": pb.COEFFICIENTS_DEEPSEEKV4,
    "cubic5": pb.COEFFICIENTS_CUBIC5,
    "custom": pb.COEFFICIENTS_CUSTOM,
}
PRECISIONS = {"highest": pb.PRECISION_HIGHEST, "high": pb.PRECISION_HIGH, "medium": pb.PRECISION_MEDIUM}
EPS_MODES = {"max": pb.EPS_MODE_MAX, "add": pb.EPS_MODE_ADD}
# Where the normalization rounds: "fp32" (Emerging-Optimizers) or "bf16" (torch.optim.Muon's order: the input
# rounded to bf16 first, its norm and each quotient in bf16; precision "medium" only). A server that does not list
# "bf16" in ServerInfo.normalizations is refused before anything is sent (the client checks; see Client).
NORMALIZATIONS = {"fp32": pb.NORMALIZATION_FP32, "bf16": pb.NORMALIZATION_BF16}
TRANSPOSES = {"auto": pb.TRANSPOSE_AUTO, "on": pb.TRANSPOSE_ON, "off": pb.TRANSPOSE_OFF}
SCALE_MODES = {
    "spectral": pb.SCALE_MODE_SPECTRAL,
    "shape_scaling": pb.SCALE_MODE_SHAPE_SCALING,
    "unit_rms_norm": pb.SCALE_MODE_UNIT_RMS_NORM,
    "none": pb.SCALE_MODE_NONE,
}
ALGORITHMS = {
    "auto": pb.ALGORITHM_AUTO,
    "row_sharded": pb.ALGORITHM_ROW_SHARDED,
    "gathered": pb.ALGORITHM_GATHERED,
    "tp_duplicated": pb.ALGORITHM_TP_DUPLICATED,
    "tp_distributed": pb.ALGORITHM_TP_DISTRIBUTED,
    "tp_blockwise": pb.ALGORITHM_TP_BLOCKWISE,
}

# Every option orthogonalize() and Shard accept; None (or absence) means the server's default.
OPTION_NAMES = ("coefficients", "custom_coefficients", "steps", "precision", "eps", "eps_mode", "transpose",
                "scale_mode", "extra_scale", "split_qkv", "normalization")


def _choice(table: Mapping[str, int], name: str, value: Any) -> int:
    key = str(value).lower()
    if key not in table:
        raise ValueError(f"orthoserve: unknown {name} {value!r}; expected one of {sorted(table)}")
    return table[key]


def ns_options(options: Mapping[str, Any]) -> pb.NsOptions:
    """NsOptions for `options` (names as OPTION_NAMES). Raises TypeError for an unknown name, ValueError for a bad value.

    Values: coefficients in COEFFICIENTS (given custom_coefficients alone means "custom"); custom_coefficients a
    sequence of (a, b, c); steps an int; precision "highest"|"high"|"medium"; eps a float; eps_mode "max"|"add"; normalization "fp32"|"bf16";
    transpose None|"auto"|True|"on"|False|"off"; scale_mode in SCALE_MODES; extra_scale a float; split_qkv
    (q, k, v) rows per query group.
    """
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"orthoserve: unknown option(s) {unknown}; known: {list(OPTION_NAMES)}")
    out = pb.NsOptions()
    coefficients = options.get("coefficients")
    custom = options.get("custom_coefficients")
    if coefficients is None and custom is not None:
        coefficients = "custom"
    if coefficients is not None:
        out.coefficients = _choice(COEFFICIENTS, "coefficients", coefficients)
    if custom is not None:
        for triple in custom:
            a, b, c = (float(v) for v in triple)
            out.custom_coefficients.add(a=a, b=b, c=c)
    if options.get("steps") is not None:
        out.steps = int(options["steps"])
    if options.get("precision") is not None:
        out.precision = _choice(PRECISIONS, "precision", options["precision"])
    if options.get("eps") is not None:
        out.eps = float(options["eps"])
    if options.get("eps_mode") is not None:
        out.eps_mode = _choice(EPS_MODES, "eps_mode", options["eps_mode"])
    if options.get("normalization") is not None:
        value = _choice(NORMALIZATIONS, "normalization", options["normalization"])
        if value == pb.NORMALIZATION_BF16:  # fp32 stays the zero value, as the C++ client encodes it.
            out.normalization = value
    transpose = options.get("transpose")
    if transpose is not None:
        if isinstance(transpose, bool):
            transpose = "on" if transpose else "off"
        out.transpose = _choice(TRANSPOSES, "transpose", transpose)
    if options.get("scale_mode") is not None:
        out.scale_mode = _choice(SCALE_MODES, "scale_mode", options["scale_mode"])
    if options.get("extra_scale") is not None:
        out.extra_scale = float(options["extra_scale"])
    split: Optional[Sequence[int]] = options.get("split_qkv")
    if split is not None and len(split) > 0:
        if len(split) != 3:
            raise ValueError(f"orthoserve: split_qkv must be [q, k, v], got {list(split)}")
        out.split_qkv.extend(int(v) for v in split)
    return out


def algorithm_value(algorithm: Optional[str]) -> int:
    """The wire Algorithm for a name in ALGORITHMS (None means auto)."""
    if algorithm is None:
        return pb.ALGORITHM_AUTO
    return _choice(ALGORITHMS, "algorithm", algorithm)


def split_options(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The NS options among kwargs (a copy)."""
    return {k: v for k, v in kwargs.items() if k in OPTION_NAMES}


def asks_bf16_normalization(specs: Sequence[Any]) -> bool:
    """Whether any of `specs` (MatrixSpec messages) asks for NORMALIZATION_BF16."""
    return any(spec.options.normalization == pb.NORMALIZATION_BF16 for spec in specs)
