"""Newton–Schulz as a function: Emerging-Optimizers' `newton_schulz` run by the service (newton_schulz, the same
signature, checks and exceptions as EO 0.3.0's muon_utils.newton_schulz; with tp_group, a group step of the group's
ranks: orthoserve.torch.tp_groups), and RemoteNewtonSchulz, a one-argument callable with orthoserve's option names.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from orthoserve import errors
from orthoserve.client import Client
from orthoserve.region_transport import RegionTransport
from orthoserve.torch.defaults import client_or_default, get_default_client, region_transport
from orthoserve.torch.fallback import falls_back, local
from orthoserve.torch.not_traced import not_traced
from orthoserve.torch.tp_groups import newton_schulz_tp

__all__ = ["newton_schulz", "RemoteNewtonSchulz"]

# Emerging-Optimizers 0.3.0's NSCoeffT (muon_utils): newton_schulz accepts these and "custom", nothing else.
_EO_COEFFICIENT_TYPES = ("simple", "quintic", "polar_express", "cans", "aol", "deepseekv4")


@not_traced
def newton_schulz(x: torch.Tensor, steps: int, coefficient_type: str = "quintic",
                  custom_coefficient_sets: Optional[List[Tuple[float, float, float]]] = None, eps: float = 1e-7,
                  transpose: Optional[bool] = None, tp_group: Any = None, use_syrk: bool = False) -> torch.Tensor:
    """Emerging-Optimizers 0.3.0's `muon_utils.newton_schulz`, computed by the orthoserve service.

    The same signature, results (within the tolerances of docs/numerics.md) and exceptions as EO's, so that it can
    replace it (e.g. by assigning it to `emerging_optimizers.orthogonalized_optimizers.muon_utils.newton_schulz`):

    Args:
        x: float32, 2-D (M, N), or 3-D (B, M, N): B independent matrices (sent as one matrix with
            MatrixSpec.nd_layout = ND_LAYOUT_BATCH). TypeError for other dims or dtypes.
        steps: Newton–Schulz iterations (0..100; the server's limit).
        coefficient_type: "simple", "quintic", "polar_express", "cans", "aol", "deepseekv4" or "custom" (then
            custom_coefficient_sets, cycled); ValueError for others or for "custom" without sets.
        eps: x / max(‖x‖_F, eps) (per matrix; over the whole matrix with tp_group).
        transpose: work on xᵀ: None (when rows > cols; with tp_group decided from this rank's block, as EO does),
            True or False — the service's transpose auto / on / off.
        tp_group: a torch.distributed process group whose ranks each hold a block of one matrix: every rank calls
            with its block, and the group's ranks make one TP_DISTRIBUTED group step. As EO's, the blocks must split
            the dim that the Gram contracts: rows (dim 0) when transpose, else columns (dim 1), in group-rank order.
            The group's key is agreed on first use (a broadcast from group rank 0); each call is the group's next
            step. Its run id (StepHeader.run_id): $ORTHOSERVE_RUN_ID, else $TORCHELASTIC_RUN_ID, else one agreed over
            the default process group before (orthoserve.runs.agree_run_id, Muon's constructor), else the group's
            key. A 3-D x with tp_group must hold one matrix (B = 1). The block goes through a shared-memory region
            on the member this rank streams to as other calls do ($ORTHOSERVE_SHM; region_transport()).
        use_syrk: accepted (EO's Triton SYRK kernel choice); the server picks its own kernels, so the numbers are
            the same either way. As EO's, with 3-D input under "medium" precision it raises TypeError.

    The precision is torch.get_float32_matmul_precision() at the call: "medium" (bf16 products, EO's default),
    "high" or "highest". No scale factor is applied (scale mode none), as EO's newton_schulz. The result is a new
    float32 tensor of x's shape on x's device. The server comes from get_default_client() (set_default_client or
    $ORTHOSERVE_ADDRESS). Errors of the service raise orthoserve.OrthoserveError subclasses. Under torch.compile a
    call is a graph break (not traced; orthoserve.torch.not_traced).
    """
    # Emerging-Optimizers' checks, in its order, with its exception types and messages.
    if x.ndim < 2 or x.ndim > 3:
        raise TypeError(f"Input tensor x must be 2d or 3d (batched 2d), got {x.ndim}d")
    if x.dtype != torch.float32:
        raise TypeError(f"Input tensor x must be in float32, got {x.dtype}")
    local_transpose = x.size(-2) > x.size(-1) if transpose is None else bool(transpose)
    custom = None
    if coefficient_type in _EO_COEFFICIENT_TYPES:
        pass
    elif coefficient_type == "custom":
        if custom_coefficient_sets is None:
            raise ValueError("custom_coefficient_sets must be provided when coefficient_type is 'custom'.")
        custom = [tuple(t) for t in custom_coefficient_sets]
        if not custom:
            raise ValueError("coefficient_sets must be non-empty.")
    else:
        raise ValueError(f"Invalid coefficient type: {coefficient_type}")
    try:
        steps = operator.index(steps)
    except TypeError:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}") from None
    if steps < 0:  # EO's itertools.islice(..., steps) raises ValueError too.
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    precision = torch.get_float32_matmul_precision()
    if precision == "medium" and use_syrk and x.ndim > 2:
        raise TypeError("use_syrk does not support N-d input.")

    opts: Dict[str, Any] = dict(coefficients=coefficient_type, custom_coefficients=custom, steps=steps,
                                precision=precision, eps=float(eps), eps_mode="max", scale_mode="none")
    if tp_group is not None:
        import torch.distributed as dist

        if x.ndim == 3:
            if x.shape[0] != 1:
                raise NotImplementedError(
                    "orthoserve.torch.newton_schulz: tp_group with a batch of several matrices (3-D x, B = "
                    f"{x.shape[0]}) is not supported (Emerging-Optimizers normalizes such a batch by one norm over all "
                    "of it); call it per matrix")
            return newton_schulz(x[0], steps, coefficient_type, custom_coefficient_sets, eps, transpose, tp_group,
                                 use_syrk).unsqueeze(0)
        if dist.get_world_size(tp_group) > 1:
            return newton_schulz_tp(x, opts, 0 if local_transpose else 1, tp_group)
        # A group of one holds the whole matrix.
        opts["transpose"] = local_transpose
    else:
        # None is the service's "auto": rows > cols, per matrix, as EO decides it.
        opts["transpose"] = "auto" if transpose is None else bool(transpose)
    if x.numel() == 0:  # EO returns an empty result; the service takes no empty matrices.
        return torch.empty(x.shape, dtype=torch.float32, device=x.device)
    client = get_default_client()
    [out] = region_transport(client).orthogonalize_batch(client, [x], [opts], nd="batch")
    return out


class RemoteNewtonSchulz:
    """A `newton_schulz(tensor) -> tensor` callable that runs on an orthoserve server, with orthoserve's option names.

    For Emerging-Optimizers' exact signature (steps, coefficient_type, custom_coefficient_sets, eps, transpose,
    tp_group, use_syrk) use orthoserve.torch.newton_schulz. This one is for code that takes a one-argument
    newton_schulz callable (KempnerForge's orthogonalize_exact, an EO orthogonalize hook) and for options EO does
    not have (eps_mode, cubic5, scale modes, bf16/fp16 input). Defaults: the server's NS defaults with scale_mode
    "none" (plain NS, as EO's newton_schulz; pass scale_mode="spectral" for Muon's scaled update) and the precision
    of torch.get_float32_matmul_precision() at call time (as EO). Shapes as EO's newton_schulz: a 2-D (M, N)
    tensor, or a 3-D (B, M, N) tensor of B independent matrices (nd_layout batch); other dims raise TypeError as EO
    does. The result has the input's dtype, shape and device.

    client: an orthoserve.Client; None: orthoserve.torch.get_default_client() at each call.
    fallback: when the service stays unreachable (a retryable failure that outlasted the client's retries),
      compute the same numerics locally (orthoserve.local_ns) with a warning, instead of raising. Off by default.
    shm: "auto" (default; None: $ORTHOSERVE_SHM, else "auto"), True or False: whether tensors go through a
      shared-memory region when the server is on this host (orthoserve.region_transport). `transport` says how the
      last call went ("shm" or "bytes"), `region_transport` more (the reason for bytes, the region).
    """

    def __init__(self, client: Optional[Client] = None, fallback: bool = False, shm: Any = None, **options: Any):
        self.client = client
        self.fallback = bool(fallback)
        self.region_transport = RegionTransport(shm, what="RemoteNewtonSchulz")
        self.options = dict(options)
        self.options.setdefault("scale_mode", "none")

    def _options(self) -> Dict[str, Any]:
        opts = dict(self.options)
        if opts.get("precision") is None:
            opts["precision"] = torch.get_float32_matmul_precision()
        return opts

    @property
    def transport(self) -> Optional[str]:
        """How the last call went: "shm" (a shared-memory region), "bytes", or None before the first."""
        return self.region_transport.transport

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.batch([x])[0]

    @not_traced
    def batch(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Orthogonalizes many 2-D or 3-D (batched) tensors in one request (a graph break under torch.compile)."""
        for x in tensors:
            if x.ndim < 2 or x.ndim > 3:  # Emerging-Optimizers' newton_schulz: the same check and exception type.
                raise TypeError(f"Input tensor x must be 2d or 3d (batched 2d), got {x.ndim}d")
        opts = self._options()
        try:
            return self.region_transport.orthogonalize_batch(client_or_default(self.client), list(tensors),
                                                             [opts] * len(tensors), nd="batch")
        except errors.OrthoserveError as e:
            if not falls_back(self.fallback, e, f"newton_schulz of {len(tensors)} tensor(s)"):
                raise
        return [local(x, opts, nd="batch") for x in tensors]

