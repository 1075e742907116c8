"""orthoserve.torch.optim.Muon: torch.optim.Muon as an import swap.

    from torch.optim import Muon               # before
    from orthoserve.torch.optim import Muon    # after: the same arguments, the same numbers

torch.optim.Muon's signature (torch 2.15: params, lr, weight_decay, momentum, nesterov, ns_coefficients, eps,
ns_steps, adjust_lr_fn — in this positional order, with its defaults), its checks and messages, its 2-D-only rule,
and its arithmetic: momentum and Nesterov as torch's lerps, the decoupled weight decay p·(1 − lr·wd), the learning
rate adjusted by adjust_lr_fn, and the Newton–Schulz iteration in torch's order, computed by the service — the
update rounded to bf16 first, normalized in bf16 (‖X‖ and eps rounded to bf16, X / max(‖X‖, eps) rounded to bf16),
then ns_steps steps of its (a, b, c) in bf16 with fp32 accumulation (NsOptions.normalization "bf16" at precision
"medium", docs/numerics.md "Drop-ins"). orthoserve's own settings (client, job, run_id, timeout, fallback, shm,
algorithm, tp_mode, overlap) are keyword-only after torch's; see orthoserve.torch.Muon for each.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

import torch

from orthoserve.client import Client
from orthoserve.torch.muon import Muon as _Muon

__all__ = ["Muon"]

# torch.optim.Muon's defaults (torch 2.15).
_NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
# The adjust_lr_fn values torch.optim.Muon accepts (orthoserve.torch.Muon accepts more).
_TORCH_ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


class Muon(_Muon):
    """torch.optim.Muon with its Newton–Schulz computed by an orthoserve fleet: torch's signature, defaults, checks and
    numbers (the module docstring)."""

    def __init__(self, params: Iterable[Any], lr: Any = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: Tuple[float, float, float] = _NS_COEFFICIENTS,
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: Optional[str] = None, *,
                 client: Optional[Client] = None, job: Optional[str] = None, run_id: Optional[str] = None,
                 timeout: Optional[float] = None, fallback: bool = False, shm: Any = None, algorithm: str = "auto",
                 tp_mode: Optional[str] = None, overlap: Any = None):
        if adjust_lr_fn not in _TORCH_ADJUST_LR_FNS:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        if len(tuple(ns_coefficients)) != 3:
            raise ValueError("Coefficients must be a tuple of exactly 3 values")
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                         ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                         flavor="torch", client=client, job=job, run_id=run_id, timeout=timeout, fallback=fallback,
                         shm=shm, algorithm=algorithm, tp_mode=tp_mode, overlap=overlap)

    def add_param_group(self, param_group: dict) -> None:
        """torch.optim.Muon's: parameters must be 2-D (torch's ValueError otherwise), checked before the group is
        added (atomic, as orthoserve.torch.Muon's)."""
        params = param_group.get("params") if isinstance(param_group, dict) else None
        if isinstance(params, torch.Tensor):
            params = [params]
        elif params is not None and not isinstance(params, set):
            params = list(params)
            param_group = {**param_group, "params": params}
        for item in params or ():
            p = item[1] if isinstance(item, tuple) and len(item) == 2 else item
            if isinstance(p, torch.Tensor) and p.ndim != 2:
                raise ValueError("Muon only supports 2D parameters whereas we found a parameter with size: "
                                 f"{p.size()}")
        super().add_param_group(param_group)
