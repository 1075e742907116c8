"""orthoserve.torch.eo.Muon: Emerging-Optimizers 0.3.0's Muon as an import swap.

    from emerging_optimizers.orthogonalized_optimizers import Muon   # before
    from orthoserve.torch.eo import Muon                             # after: the same arguments, the same numbers

EO's signature (params, lr, momentum, weight_decay positional; the rest keyword-only: nesterov, weight_decay_method
"decoupled" | "independent" | "l2" | "palm", fp32_matmul_prec, coefficient_type, num_ns_steps, scale_mode,
extra_scale_factor, use_syrk), its defaults, and its step (EO's OrthogonalizedOptimizer.step: the weight decay of its
WeightDecayMixin, EMA momentum, Nesterov, newton_schulz in fp32_matmul_prec with eps 1e-7 in max mode and fp32
normalization, the scale of scale_mode × extra_scale_factor), the Newton–Schulz computed by the service.
orthoserve's own settings (client, job, run_id, timeout, fallback, shm, algorithm, tp_mode, split_qkv, is_qkv_fn,
qkv_split_shapes, nd, overlap) are keyword-only after EO's; see orthoserve.torch.Muon for each.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from orthoserve.client import Client
from orthoserve.torch.muon import Muon as _Muon

__all__ = ["Muon"]


class Muon(_Muon):
    """Emerging-Optimizers' Muon with its Newton–Schulz computed by an orthoserve fleet: EO's signature, defaults and
    numbers (the module docstring)."""

    def __init__(self, params: Iterable[Any], lr: float = 3e-4, momentum: float = 0.95, weight_decay: float = 0.01, *,
                 nesterov: bool = False, weight_decay_method: str = "decoupled", fp32_matmul_prec: str = "medium",
                 coefficient_type: str = "quintic", num_ns_steps: int = 5, scale_mode: str = "spectral",
                 extra_scale_factor: float = 1.0, use_syrk: bool = False, client: Optional[Client] = None,
                 job: Optional[str] = None, run_id: Optional[str] = None, timeout: Optional[float] = None,
                 fallback: bool = False, shm: Any = None, algorithm: str = "auto", tp_mode: Optional[str] = None,
                 split_qkv: bool = False, is_qkv_fn: Optional[Callable[[torch.Tensor], bool]] = None,
                 qkv_split_shapes: Optional[Sequence[int]] = None, nd: Optional[str] = None,
                 overlap: Any = None):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                         weight_decay_method=weight_decay_method, fp32_matmul_prec=fp32_matmul_prec,
                         coefficient_type=coefficient_type, num_ns_steps=num_ns_steps, scale_mode=scale_mode,
                         extra_scale_factor=extra_scale_factor, use_syrk=use_syrk, flavor="eo", client=client,
                         job=job, run_id=run_id, timeout=timeout, fallback=fallback, shm=shm, algorithm=algorithm,
                         tp_mode=tp_mode, split_qkv=split_qkv, is_qkv_fn=is_qkv_fn,
                         qkv_split_shapes=qkv_split_shapes, nd=nd, overlap=overlap)
