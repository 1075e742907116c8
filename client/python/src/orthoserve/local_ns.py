"""The numerics contract of docs/numerics.md computed locally in torch: the fallback of orthoserve.torch when the
service stays unreachable (RemoteNewtonSchulz(fallback=True), Muon(fallback=True)).

It follows the contract step for step: an N-d tensor viewed as shape[0] x prod(rest), transpose to the wide side,
normalization (sum of squares in float64, divisor rounded once to fp32, max or add eps mode), the coefficient
schedules of common/ns_options.cc (cycled or repeating the last triple), HIGHEST/HIGH in fp32 and MEDIUM with
bf16 operands, fp32 accumulation and bf16 rounding of each product's output (A, B and the new X), the scale
modes and the extra scale (an exact double product rounded once to fp32), split_qkv. Results agree with the
server's within the tolerances of docs/numerics.md §4 (the accumulation order of the products differs), not bit
for bit. The computation runs on the input's device.

The precision is set with torch.set_float32_matmul_precision for the duration of a call (restored after), which
is process-wide: matmuls that other threads run meanwhile see it too.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

from orthoserve import options as options_lib

__all__ = ["orthogonalize", "newton_schulz", "schedule", "scale_factor", "COEFFICIENT_SETS"]

Triple = Tuple[float, float, float]

# common/ns_options.cc, verbatim.
COEFFICIENT_SETS = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)],
    "polar_express": [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                      (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                      (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)],
    "aol": [(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169)],
    "cans": [(8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806), (3.9619, -2.9541, 0.5630),
             (3.2866, -2.4647, 0.5074), (2.2737, -1.6447, 0.4162)],
    "deepseekv4": [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2,
    "cubic5": [(3.3656576, -3.3420992, 0.0), (2.5744352, -1.4957376, 0.0), (2.5368962, -1.4312570, 0.0),
               (2.4418906, -1.2764040, 0.0), (2.2230472, -0.9630650, 0.0)],
}
_REPEAT_LAST = ("polar_express", "cans", "deepseekv4")
_MAX_STEPS = 100
_SCALE_MODES = ("spectral", "shape_scaling", "unit_rms_norm", "none")


def schedule(coefficients: Optional[str] = "quintic", steps: int = 5,
             custom_coefficients: Optional[Sequence[Sequence[float]]] = None) -> List[Triple]:
    """One (a, b, c) per step: the set's list, then its tail rule (repeat the last triple for polar_express,
    cans and deepseekv4; cycle otherwise). ValueError as the server's validation: steps outside 0..100, cubic5
    without steps = 5, custom without triples, an unknown set."""
    if custom_coefficients is not None and coefficients in (None, "custom"):
        coefficients = "custom"
    coefficients = coefficients or "quintic"
    if not 0 <= steps <= _MAX_STEPS:
        raise ValueError(f"orthoserve: steps = {steps} is out of range; use 0 to {_MAX_STEPS}")
    if coefficients == "custom":
        table = [tuple(float(v) for v in t) for t in (custom_coefficients or ())]
        if not table or any(len(t) != 3 for t in table):
            raise ValueError("orthoserve: coefficients custom needs a non-empty custom_coefficients list of (a, b, c)")
    elif coefficients in COEFFICIENT_SETS:
        if custom_coefficients:
            raise ValueError(f"orthoserve: custom_coefficients given with coefficients {coefficients!r}")
        table = COEFFICIENT_SETS[coefficients]
    else:
        raise ValueError(f"orthoserve: unknown coefficients {coefficients!r}; expected one of "
                         f"{sorted([*COEFFICIENT_SETS, 'custom'])}")
    if coefficients == "cubic5" and steps != 5:
        raise ValueError(f"orthoserve: coefficients cubic5 needs steps = 5 exactly, got {steps}")
    if coefficients in _REPEAT_LAST:
        return [table[min(i, len(table) - 1)] for i in range(steps)]  # type: ignore[misc]
    return [table[i % len(table)] for i in range(steps)]  # type: ignore[misc]


def scale_factor(rows: int, cols: int, scale_mode: str = "spectral", extra_scale: float = 1.0) -> float:
    """scale(out = rows, in = cols) x extra_scale: spectral sqrt(max(out, in)), shape_scaling sqrt(max(1, out/in)),
    unit_rms_norm sqrt(out/in), none 1."""
    if scale_mode == "spectral":
        scale = math.sqrt(max(rows, cols))
    elif scale_mode == "shape_scaling":
        scale = math.sqrt(max(1.0, rows / cols))
    elif scale_mode == "unit_rms_norm":
        scale = math.sqrt(rows / cols)
    elif scale_mode == "none":
        scale = 1.0
    else:
        raise ValueError(f"orthoserve: unknown scale_mode {scale_mode!r}; expected one of {list(_SCALE_MODES)}")
    return scale * float(extra_scale)


@contextlib.contextmanager
def _matmul_precision(precision: str, device: torch.device) -> Iterator[None]:
    # fp32 products everywhere but HIGH on a GPU (TF32, as the CUDA backend). MEDIUM's products are fp32 products
    # of bf16 values: exact, accumulated in fp32 (docs/numerics.md §2).
    wanted = "high" if precision == "high" and device.type == "cuda" else "highest"
    old = torch.get_float32_matmul_precision()
    if old == wanted:
        yield
        return
    torch.set_float32_matmul_precision(wanted)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def _transpose(transpose: Any, rows: int, cols: int) -> bool:
    if transpose is None or transpose == "auto":
        return rows > cols
    if transpose in (True, "on"):
        return True
    if transpose in (False, "off"):
        return False
    raise ValueError(f"orthoserve: transpose must be None, 'auto', True/'on' or False/'off', got {transpose!r}")


def _bf16_scalar(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).to(torch.float32))


def newton_schulz(g: torch.Tensor, steps: Sequence[Triple], *, precision: str = "medium", eps: float = 1e-7,
                  eps_mode: str = "max", transpose: Any = "auto", normalization: str = "fp32") -> torch.Tensor:
    """The loop of docs/numerics.md §2 on a 2-D tensor: returns the fp32 result (unscaled) of g's shape."""
    if normalization not in options_lib.NORMALIZATIONS:
        raise ValueError(f"orthoserve: normalization must be one of {sorted(options_lib.NORMALIZATIONS)}, got "
                         f"{normalization!r}")
    if normalization == "bf16" and precision != "medium":
        raise ValueError(f"orthoserve: normalization 'bf16' needs precision 'medium', got {precision!r}")
    if precision not in options_lib.PRECISIONS:
        raise ValueError(f"orthoserve: unknown precision {precision!r}; "
                         f"expected one of {sorted(options_lib.PRECISIONS)}")
    if eps_mode not in ("max", "add"):
        raise ValueError(f"orthoserve: eps_mode must be 'max' or 'add', got {eps_mode!r}")
    if eps < 0:
        raise ValueError(f"orthoserve: eps must be >= 0, got {eps}")
    rows, cols = g.shape
    flip = _transpose(transpose, rows, cols)
    x = g.to(torch.float32)
    if flip:
        x = x.mT
    x = x.contiguous()
    if x.numel() == 0:
        return torch.zeros(rows, cols, dtype=torch.float32, device=g.device)
    if normalization == "bf16":
        # torch.optim.Muon's order: the input in bf16, its norm and eps rounded to bf16 (server/engine/backend.h).
        x = _bf16(x)
        norm_b = _bf16_scalar(math.sqrt(float(x.double().square().sum())))
        eps_b = _bf16_scalar(eps)
        divisor = max(norm_b, eps_b) if eps_mode == "max" else _bf16_scalar(norm_b + eps_b)
    else:
        norm = math.sqrt(float(x.double().square().sum()))
        divisor = float(torch.tensor(max(norm, eps) if eps_mode == "max" else norm + eps, dtype=torch.float32))
    if divisor != 0.0:  # An all-zero matrix with eps = 0 stays zero, never NaN.
        x = x / torch.tensor(divisor, dtype=torch.float32, device=x.device)
    medium = precision == "medium"
    if medium:
        x = _bf16(x)
    with _matmul_precision(precision, x.device):
        for a, b, c in steps:
            gram = x @ x.mT
            if medium:
                gram = _bf16(gram)
            if c != 0:
                poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
                if medium:
                    poly = _bf16(poly)
                x = torch.addmm(x, poly, x, beta=a, alpha=1.0)
            else:
                x = torch.addmm(x, gram, x, beta=a, alpha=b)
            if medium:
                x = _bf16(x)
    return x.mT.contiguous() if flip else x


def _one(g: torch.Tensor, steps: Sequence[Triple], scale_mode: str, extra_scale: float, **kw: Any) -> torch.Tensor:
    rows, cols = g.shape
    scale = scale_factor(rows, cols, scale_mode, extra_scale)
    out = newton_schulz(g, steps, **kw)
    return (out.double() * scale).to(torch.float32)


def orthogonalize(x: torch.Tensor, *, coefficients: Optional[str] = None,
                  custom_coefficients: Optional[Sequence[Sequence[float]]] = None, steps: Optional[int] = None,
                  precision: Optional[str] = None, eps: Optional[float] = None, eps_mode: Optional[str] = None,
                  transpose: Any = None, scale_mode: Optional[str] = None, extra_scale: Optional[float] = None,
                  split_qkv: Optional[Sequence[int]] = None, normalization: Optional[str] = None) -> torch.Tensor:
    """What the server returns for whole tensor `x` with these options (orthoserve.options names; None: the server's
    default — quintic, 5 steps, medium, eps 1e-7 in max mode, auto transpose, spectral scale, extra scale 1):
    a tensor of x's dtype, shape and device. N-d tensors are viewed as shape[0] x prod(rest).
    ValueError for bad options or shapes, as the server's INVALID_ARGUMENT."""
    if x.dim() < 2:
        raise ValueError(f"orthoserve: a matrix needs at least 2 dims, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"orthoserve: dtype {x.dtype}; expected float32, bfloat16 or float16")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("orthoserve: the matrix holds non-finite values")
    triples = schedule(coefficients, 5 if steps is None else int(steps), custom_coefficients)
    kw = dict(precision=(precision or "medium").lower(), eps=1e-7 if eps is None else float(eps),
              eps_mode=(eps_mode or "max").lower(), transpose=transpose,
              normalization=(normalization or "fp32").lower())
    scale_mode = (scale_mode or "spectral").lower()
    extra = 1.0 if extra_scale is None else float(extra_scale)
    rows, cols = int(x.shape[0]), int(math.prod(x.shape[1:]))
    g = x.detach().reshape(rows, cols)
    if not split_qkv:
        out = _one(g, triples, scale_mode, extra, **kw)
        return out.to(x.dtype).reshape(x.shape)
    if len(split_qkv) != 3 or any(int(v) <= 0 for v in split_qkv):
        raise ValueError(f"orthoserve: split_qkv must be [q, k, v] of positive rows, got {list(split_qkv)}")
    q, k, v = (int(n) for n in split_qkv)
    group = q + k + v
    if rows % group:
        raise ValueError(f"orthoserve: split_qkv {[q, k, v]}: rows {rows} are not divisible by {group}")
    grouped = g.reshape(rows // group, group, cols)
    out = torch.empty(rows // group, group, cols, dtype=torch.float32, device=x.device)
    for first, n in ((0, q), (q, k), (q + k, v)):
        part = grouped[:, first:first + n].reshape(-1, cols)
        out[:, first:first + n] = _one(part, triples, scale_mode, extra, **kw).reshape(rows // group, n, cols)
    return out.to(x.dtype).reshape(x.shape)
