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
