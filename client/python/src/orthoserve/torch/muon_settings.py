"""Muon's settings: the two flavors' defaults (Emerging-Optimizers 0.3.0's Muon and torch.optim.Muon), whose defaults
the arguments not given take (flavor_of), the aliases (canonical) and the checks of a param group's settings (check,
with torch.optim.Muon's messages where it checks the same), and torch.optim.Muon's learning-rate adjustment
(lr_ratio)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from orthoserve import options as options_lib

__all__ = ["FLAVOR_DEFAULTS", "TP_MODES", "ND_MODES", "flavor_of", "canonical", "check", "triples", "lr_ratio",
           "nd_of", "matrix_dims", "normalization_of"]

_PRECISIONS = ("highest", "high", "medium")
_WEIGHT_DECAY_METHODS = ("decoupled", "independent", "l2", "palm")
# Muon's tp_mode: None (sharded DTensors by `algorithm`) or a TP algorithm (orthoserve.torch.updates).
TP_MODES = (None, "duplicated", "distributed", "blockwise")
# Arguments only one of the two optimizers has: they tell whose defaults the rest take (flavor_of).
EO_ONLY = ("weight_decay_method", "fp32_matmul_prec", "coefficient_type", "num_ns_steps", "scale_mode",
           "extra_scale_factor")
TORCH_ONLY = ("ns_coefficients", "ns_steps", "adjust_lr_fn")
# torch.optim.Muon's default NS coefficients (Keller Jordan's triple; EO's "simple").
_TORCH_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Every param group holds these (defaults from the flavor, then the constructor's arguments, then the group's).
FLAVOR_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # emerging_optimizers.orthogonalized_optimizers.Muon 0.3.0
    "eo": dict(lr=3e-4, momentum=0.95, weight_decay=0.01, nesterov=False, weight_decay_method="decoupled",
               fp32_matmul_prec="medium", coefficient_type="quintic", ns_coefficients=None, ns_steps=5, eps=1e-7,
               scale_mode="spectral", extra_scale_factor=1.0, adjust_lr_fn="none", use_syrk=False, nd="flatten",
               normalization=None),
    # torch.optim.Muon (torch 2.15): bf16 NS (= "medium"), no scale factor, lr adjusted by adjust_lr_fn.
    "torch": dict(lr=1e-3, momentum=0.95, weight_decay=0.1, nesterov=True, weight_decay_method="decoupled",
                  fp32_matmul_prec="medium", coefficient_type="custom", ns_coefficients=_TORCH_NS_COEFFICIENTS,
                  ns_steps=5, eps=1e-7, scale_mode="none", extra_scale_factor=1.0, adjust_lr_fn=None,
                  use_syrk=False, nd="flatten", normalization=None),
}
_ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped", "none")
# Where the server's normalization rounds (orthoserve.options.NORMALIZATIONS); None: the flavor's (normalization_of).
_NORMALIZATIONS = (None, "fp32", "bf16")
# How a parameter of >= 3 dims is orthogonalized (its group's "nd", or its own `orthoserve_nd` attribute): "flatten"
# as one shape[0] x prod(rest) matrix, "batch" as prod(shape[:-2]) matrices of shape[-2] x shape[-1] (stacked
# experts (E, out, in)), MatrixSpec.nd_layout.
ND_MODES = ("flatten", "batch")
_MAX_NS_STEPS = 100


def flavor_of(flavor: Optional[str], given: Dict[str, Any]) -> str:
    """Whose defaults the arguments not given take: `flavor` ("eo" or "torch") when given, else "torch" when
    torch.optim.Muon's own arguments are among `given` (the arguments given, by name) and "eo" otherwise. TypeError
    when arguments only EO has and arguments only torch has are mixed without a flavor; ValueError for another
    flavor."""
    if flavor is None:
        eo_given = [k for k in EO_ONLY if k in given]
        torch_given = [k for k in TORCH_ONLY if k in given]
        if eo_given and torch_given:
            raise TypeError(f"Muon: {torch_given} are torch.optim.Muon's arguments and {eo_given} Emerging-"
                            "Optimizers' Muon's; pass flavor='torch' or flavor='eo' to say whose defaults the "
                            "other arguments take")
        flavor = "torch" if torch_given else "eo"
    if flavor not in FLAVOR_DEFAULTS:
        raise ValueError(f"Muon: flavor must be 'eo', 'torch' or None, got {flavor!r}")
    return flavor


def triples(value: Any) -> List[Tuple[float, float, float]]:
    """ns_coefficients as a list of (a, b, c): one triple (torch.optim.Muon's form) or a sequence of them."""
    items = list(value)
    if items and all(isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.numel() == 1) for v in items):
        items = [items]
    out = []
    for t in items:
        t = tuple(float(v) for v in t)
        if len(t) != 3:
            raise ValueError("Coefficients must be a tuple of exactly 3 values")
        out.append(t)
    if not out:
        raise ValueError("ns_coefficients must hold at least one (a, b, c) triple")
    return out


def nd_of(p: torch.Tensor, group_nd: str) -> str:
    """Parameter p's nd: its own `orthoserve_nd` attribute when it has one, else its group's. ValueError for another
    value than ND_MODES'."""
    nd = getattr(p, "orthoserve_nd", None) or group_nd
    if nd not in ND_MODES:
        raise ValueError(f"Muon: nd (a param group's, or a parameter's orthoserve_nd) must be one of {ND_MODES}, "
                         f"got {nd!r}")
    return nd


def matrix_dims(shape: Tuple[int, ...], nd: str) -> Tuple[int, int]:
    """(rows, cols) of each matrix a parameter of `shape` is orthogonalized as: shape[0] x prod(rest), or with nd
    "batch" and >= 3 dims shape[-2] x shape[-1] (as for adjust_lr_fn)."""
    if nd == "batch" and len(shape) >= 3:
        return shape[-2], shape[-1]
    return shape[0], math.prod(shape[1:])


def lr_ratio(adjust_lr_fn: Optional[str], rows: int, cols: int) -> float:
    """torch.optim.Muon's _adjust_lr factor for a rows x cols parameter; "none": 1 (Emerging-Optimizers)."""
    if adjust_lr_fn == "none":
        return 1.0
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(rows / cols)  # spectral_unclamped


def normalization_of(flavor: str, settings: Dict[str, Any]) -> str:
    """The normalization a param group's matrices are sent with: its own setting when given, else torch.optim.Muon's
    order ("bf16": the update rounded to bf16 before it is normalized in bf16) for flavor "torch" at precision
    "medium" (torch's bf16 NS), and "fp32" (Emerging-Optimizers') otherwise."""
    given = settings.get("normalization")
    if given is not None:
        return given
    return "bf16" if flavor == "torch" and settings["fp32_matmul_prec"] == "medium" else "fp32"


def canonical(settings: Dict[str, Any]) -> Dict[str, Any]:
    """settings with the aliases resolved: num_ns_steps -> ns_steps, custom_coefficients -> ns_coefficients,
    and coefficient_type "custom" where ns_coefficients come without a coefficient_type."""
    out = dict(settings)
    if "num_ns_steps" in out:
        if "ns_steps" in out:
            raise TypeError("Muon: give ns_steps or num_ns_steps, not both")
        out["ns_steps"] = out.pop("num_ns_steps")
    if "custom_coefficients" in out:
        if "ns_coefficients" in out:
            raise TypeError("Muon: give custom_coefficients or ns_coefficients, not both")
        out["ns_coefficients"] = out.pop("custom_coefficients")
    if out.get("ns_coefficients") is not None and "coefficient_type" not in out:
        out["coefficient_type"] = "custom"
    return out

def check(group: Dict[str, Any], where: str) -> None:
    """ValueError for a bad setting of a param group (or the defaults), with torch.optim.Muon's messages where
    it checks the same."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= float(lr):
        raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
    if not 0.0 <= group["momentum"]:
        raise ValueError(f"momentum should be >= 0 but is: {group['momentum']}")
    if not 0.0 <= group["weight_decay"]:
        raise ValueError(f"weight decay should be >= 0 but is: {group['weight_decay']}")
    if group["weight_decay_method"] not in _WEIGHT_DECAY_METHODS:
        raise ValueError(f"weight_decay_method must be one of {_WEIGHT_DECAY_METHODS}, got "
                         f"{group['weight_decay_method']}")
    if group["fp32_matmul_prec"] not in _PRECISIONS:
        raise ValueError(f"fp32_matmul_prec must be one of {_PRECISIONS}, got {group['fp32_matmul_prec']}")
    coefficient_type = group["coefficient_type"]
    if coefficient_type not in options_lib.COEFFICIENTS:
        raise ValueError(f"{where}: coefficient_type must be one of {sorted(options_lib.COEFFICIENTS)}, got "
                         f"{coefficient_type!r}")
    if coefficient_type == "custom":
        if group.get("ns_coefficients") is None:
            raise ValueError(f"{where}: coefficient_type 'custom' needs ns_coefficients (custom_coefficients)")
        triples(group["ns_coefficients"])
    steps = group["ns_steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"num_ns_steps (ns_steps) must be at least 1, got {steps}")
    if steps > _MAX_NS_STEPS:
        raise ValueError(f"Number of steps must be at most {_MAX_NS_STEPS}, got {steps}")
    eps = group["eps"]
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{where}: eps must be a finite number >= 0, got {eps!r}")
    if group["scale_mode"] not in options_lib.SCALE_MODES:
        raise ValueError(f"{where}: scale_mode must be one of {sorted(options_lib.SCALE_MODES)}, got "
                         f"{group['scale_mode']!r}")
    if group.get("nd", "flatten") not in ND_MODES:
        raise ValueError(f"{where}: nd must be one of {ND_MODES}, got {group['nd']!r}")
    normalization = group.get("normalization")
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"{where}: normalization must be None, 'fp32' or 'bf16', got {normalization!r}")
    if normalization == "bf16" and group["fp32_matmul_prec"] != "medium":
        raise ValueError(f"{where}: normalization 'bf16' (torch.optim.Muon's order) needs fp32_matmul_prec 'medium', "
                         f"got {group['fp32_matmul_prec']!r}")
    if group["adjust_lr_fn"] not in _ADJUST_LR_FNS:
        raise ValueError(f"Adjust learning rate function {group['adjust_lr_fn']} is not supported")
