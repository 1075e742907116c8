"""Emerging-Optimizers 0.3.0 as the numerics oracle (docs/numerics.md): its newton_schulz and get_muon_scale_factor,
run in fp32 under a chosen torch matmul precision."""

from __future__ import annotations

import contextlib
from typing import get_args

import torch
from emerging_optimizers.orthogonalized_optimizers import muon_utils
from emerging_optimizers.orthogonalized_optimizers.muon import get_muon_scale_factor

COEFFICIENT_TYPES = list(get_args(muon_utils.NSCoeffT))
SCALE_MODES = ["shape_scaling", "spectral", "unit_rms_norm"]
CUSTOM = [(3.0, -3.2, 1.2), (2.5, -1.5, 0.5), (1.5, -0.5, 0.0)]


@contextlib.contextmanager
def matmul_precision(precision: str):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def newton_schulz(x: torch.Tensor, steps: int = 5, coefficient_type: str = "quintic", custom=None,
                  precision: str = "highest") -> torch.Tensor:
    with matmul_precision(precision):
        return muon_utils.newton_schulz(x.float(), steps=steps, coefficient_type=coefficient_type,
                                        custom_coefficient_sets=custom)


def scaled(x: torch.Tensor, scale_mode: str, extra: float = 1.0, **kw) -> torch.Tensor:
    rows, cols = x.shape[0], x[0].numel()
    return newton_schulz(x.reshape(rows, cols), **kw).reshape(x.shape) * get_muon_scale_factor(rows, cols, scale_mode) * extra


def newton_schulz_float64(x, steps: int = 5, coefficient_type: str = "quintic", eps: float = 1e-7):
    """Emerging-Optimizers' Newton–Schulz loop (its coefficient sets and their iteration order) in float64 with
    numpy: transposed to the wide side, x / max(‖x‖_F, eps), then X = aX + (bA + cA²)X with A = XXᵀ per step; no
    scale factor. The reference an fp32 HIGHEST result is compared with (relative Frobenius error ~1e-6)."""
    import numpy as np

    sets = muon_utils._COEFFICIENT_SETS[coefficient_type]
    mode = "repeat_last" if coefficient_type in ("polar_express", "cans", "deepseekv4") else "cycle"
    x = np.asarray(x, dtype=np.float64)
    transpose = x.shape[0] > x.shape[1]
    X = x.T if transpose else x
    X = X / max(float(np.linalg.norm(X)), eps)
    for a, b, c in muon_utils.get_coefficient_iterator(steps, sets, mode=mode):
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if transpose else X


def relative_error(got, ref) -> float:
    """‖got − ref‖_F / ‖ref‖_F in float64."""
    import numpy as np

    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
