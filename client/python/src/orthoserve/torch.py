"""PyTorch integration: a remote newton_schulz callable, DTensor block helpers and a remote Muon optimizer.

Muon follows NVIDIA Emerging-Optimizers 0.3.0 (OrthogonalizedOptimizer.step and Muon) step for step: weight
decay ("decoupled" p -= lr·wd·p, "independent" p -= wd·p, "l2" grad += wd·p), EMA momentum buf.lerp_(grad,
1 - momentum), Nesterov grad.lerp(buf, momentum) or the buffer itself, orthogonalize (NS, then the scale factor
and extra scale), p -= lr·update. The orthogonalization of every parameter of a step is one remote request
(whole tensors in one stream; DTensor shards as one group step per shard group).
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from orthoserve import errors, layout, local_ns, options as options_lib
from orthoserve.client import Client

__all__ = ["RemoteNewtonSchulz", "Muon", "dtensor_block", "dtensor_group", "dtensor_shard", "is_dtensor"]

_PRECISIONS = ("highest", "high", "medium")
_WEIGHT_DECAY_METHODS = ("decoupled", "independent", "l2")
_TP_MODES = (None, "duplicated", "distributed", "blockwise")

logger = logging.getLogger("orthoserve")


def _falls_back(enabled: bool, error: errors.OrthoserveError, what: str) -> bool:
    """Whether to compute `what` locally after `error`: fallback is on and the service stays unreachable (a
    retryable failure that outlasted the client's retries). Warns and logs when it does."""
    if not (enabled and error.retryable):
        return False
    message = f"orthoserve: {what} failed ({error}); computing it locally on the trainer (fallback=True)"
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logger.warning("%s", message)
    return True


def _local(tensor: torch.Tensor, opts: Dict[str, Any], nd: str = "flatten") -> torch.Tensor:
    """The server's result for whole `tensor`, computed here (orthoserve.local_ns); nd as Client.orthogonalize."""
    ns = options_lib.split_options(opts)
    if nd == "batch" and tensor.dim() >= 3:
        if tensor.shape[0] == 0:
            return torch.empty_like(tensor)
        return torch.stack([local_ns.orthogonalize(t, **ns) for t in tensor])
    return local_ns.orthogonalize(tensor, **ns)


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed tensors
        return None
    return DTensor


def is_dtensor(x: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(x, cls)


class RemoteNewtonSchulz:
    """A `newton_schulz(tensor) -> tensor` callable that runs on an orthoserve server.

    Drop-in where a newton_schulz function is expected (the `newton_schulz` argument of KempnerForge's
    orthogonalize_exact, an Emerging-Optimizers orthogonalize hook). Defaults: the server's NS defaults with
    scale_mode "none" (plain NS, as EO's newton_schulz; pass scale_mode="spectral" for Muon's scaled update)
    and the precision of torch.get_float32_matmul_precision() at call time (as EO). Shapes as EO's
    newton_schulz: a 2-D (M, N) tensor, or a 3-D (B, M, N) tensor of B independent matrices (sent as B matrices
    of one request); other dims raise TypeError as EO does. The result has the input's dtype, shape and device.

    fallback: when the service stays unreachable (a retryable failure that outlasted the client's retries),
      compute the same numerics locally (orthoserve.local_ns) with a warning, instead of raising. Off by default.
    """

    def __init__(self, client: Client, fallback: bool = False, **options: Any):
        self.client = client
        self.fallback = bool(fallback)
        self.options = dict(options)
        self.options.setdefault("scale_mode", "none")

    def _options(self) -> Dict[str, Any]:
        opts = dict(self.options)
        if opts.get("precision") is None:
            opts["precision"] = torch.get_float32_matmul_precision()
        return opts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.batch([x])[0]

    def batch(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Orthogonalizes many 2-D or 3-D (batched) tensors in one request."""
        for x in tensors:
            if x.ndim < 2 or x.ndim > 3:  # Emerging-Optimizers' newton_schulz: the same check and exception type.
                raise TypeError(f"Input tensor x must be 2d or 3d (batched 2d), got {x.ndim}d")
        opts = self._options()
        try:
            return self.client.orthogonalize_batch(list(tensors), [opts] * len(tensors), nd="batch")
        except errors.OrthoserveError as e:
            if not _falls_back(self.fallback, e, f"newton_schulz of {len(tensors)} tensor(s)"):
                raise
        return [_local(x, opts, nd="batch") for x in tensors]


# -- DTensor helpers ---------------------------------------------------------------------------------------

def _sharded_mesh_dims(dt: Any) -> List[int]:
    from torch.distributed.tensor import Replicate, Shard

    dims = []
    for d, placement in enumerate(dt.placements):
        if isinstance(placement, Replicate) or dt.device_mesh.size(d) == 1:
            continue
        if not isinstance(placement, Shard):
            raise ValueError(f"orthoserve: placement {placement} of a parameter is not supported (Shard/Replicate)")
        dims.append(d)
    return dims


def dtensor_block(dt: Any) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """((row_offset, col_offset), (rows, cols)) of this rank's local shard of DTensor `dt` in its 2-D view.

    Shard(0) placements give row blocks, Shard(1) column blocks (torch.chunk sizes: the last ranks may hold
    shorter or empty blocks); ValueError for layouts that are not rectangles of the view."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local_shape, offset = compute_local_shape_and_global_offset(dt.shape, dt.device_mesh, dt.placements)
    return layout.block_of(tuple(dt.shape), tuple(local_shape), tuple(offset))


def dtensor_group(dt: Any, prefix: str = "g") -> Tuple[str, int, int]:
    """(group name, rank, world) of the trainer group that together holds DTensor `dt`'s blocks.

    The group is the ranks of the mesh dims that shard `dt` (W = product of their sizes, rank = the mixed-radix
    index of this rank's coordinates on them); ranks that differ on replicated dims are separate groups, told
    apart in the name. The name is the same on every rank of the group. world 1 means "not sharded"."""
    mesh = dt.device_mesh
    dims = _sharded_mesh_dims(dt)
    coords = mesh.get_coordinate()
    if coords is None:
        raise ValueError("orthoserve: this rank is not part of the DTensor's mesh")
    rank, world = 0, 1
    for d in dims:
        rank = rank * mesh.size(d) + coords[d]
        world *= mesh.size(d)
    layout_key = hashlib.sha1(repr((tuple(mesh.mesh.shape), mesh.mesh.flatten().tolist())).encode()).hexdigest()[:10]
    replica = [coords[d] for d in range(mesh.ndim) if d not in dims]
    name = f"{prefix}/mesh-{layout_key}/shard{''.join(map(str, dims)) or '-'}/at{'.'.join(map(str, replica)) or '-'}"
    return name, rank, world


def dtensor_shard(name: str, dt: Any, data: Optional[torch.Tensor] = None, **kwargs: Any) -> layout.Shard:
    """The Shard of this rank's block of DTensor `dt` (data: a tensor of the local shard's shape, default the
    local shard itself); kwargs: algorithm, partition_dim and NS options as for orthoserve.Shard."""
    offset, _ = dtensor_block(dt)
    local = dt.to_local() if data is None else data
    return layout.Shard(name, tuple(dt.shape), offset, local, **kwargs)


def _partition_dim(dt: Any) -> int:
    dims = {dt.placements[d].dim for d in _sharded_mesh_dims(dt)}
    if len(dims) != 1 or next(iter(dims)) not in (0, 1):
        raise ValueError(f"orthoserve: TP modes need blocks split along one of dims 0/1, got {dt.placements}")
    return next(iter(dims))


# -- Muon --------------------------------------------------------------------------------------------------

class Muon(torch.optim.Optimizer):
    """Emerging-Optimizers' Muon with the orthogonalization done by an orthoserve fleet.

    Args (EO's names and defaults): lr 3e-4, momentum 0.95, weight_decay 0.01, nesterov False,
      weight_decay_method "decoupled" | "independent" | "l2", fp32_matmul_prec "highest" | "high" | "medium"
      (the server's precision), coefficient_type (simple, quintic, polar_express, aol, cans, deepseekv4,
      cubic5, custom — then custom_coefficients), num_ns_steps 5, scale_mode "spectral" | "shape_scaling" |
      "unit_rms_norm" | "none", extra_scale_factor 1.0.
      split_qkv, is_qkv_fn, qkv_split_shapes: as MindSpeed's TensorParallelMuon: parameters for which
        is_qkv_fn(p) is true are orthogonalized per Q, K and V ([q, k, v] rows per query group).
      client: an orthoserve.Client. job: the trainer job id for group steps (default $ORTHOSERVE_JOB or "muon").
      tp_mode: None (DTensors by the "auto" algorithm), "duplicated", "distributed" or "blockwise" (TP
        algorithms for sharded DTensors); a parameter's own `tp_mode` attribute overrides it.
      algorithm: the algorithm for sharded DTensors when no TP mode applies (default "auto"); a parameter's
        own `orthoserve_algorithm` attribute overrides it.
      timeout: deadline in seconds of each attempt of a remote call (the client's RetryPolicy bounds them all).
      fallback: when the service stays unreachable (a retryable failure that outlasted the client's retries),
        orthogonalize the whole (non-DTensor-sharded) parameters locally (orthoserve.local_ns) with a warning,
        instead of raising. Off by default. Sharded DTensor group steps have no local fallback: their error
        propagates.
    Parameters must have >= 2 dims (N-d: viewed as shape[0] x prod(rest)). DTensor parameters are sent as group
    steps of their mesh's shard group, each rank only its local shard; plain tensors go whole from each rank.
    """

    def __init__(self, params: Iterable[Any], client: Client, lr: float = 3e-4, momentum: float = 0.95,
                 weight_decay: float = 0.01, *, nesterov: bool = False, weight_decay_method: str = "decoupled",
                 fp32_matmul_prec: str = "medium", coefficient_type: str = "quintic", num_ns_steps: int = 5,
                 scale_mode: str = "spectral", extra_scale_factor: float = 1.0,
                 custom_coefficients: Optional[Sequence[Tuple[float, float, float]]] = None,
                 split_qkv: bool = False, is_qkv_fn: Optional[Callable[[torch.Tensor], bool]] = None,
                 qkv_split_shapes: Optional[Sequence[int]] = None, tp_mode: Optional[str] = None,
                 algorithm: str = "auto", job: Optional[str] = None, timeout: Optional[float] = None,
                 fallback: bool = False):
        if num_ns_steps < 1:
            raise ValueError(f"num_ns_steps must be at least 1, got {num_ns_steps}")
        if weight_decay_method not in _WEIGHT_DECAY_METHODS:
            raise ValueError(f"weight_decay_method must be one of {_WEIGHT_DECAY_METHODS}, got {weight_decay_method}")
        if fp32_matmul_prec not in _PRECISIONS:
            raise ValueError(f"fp32_matmul_prec must be one of {_PRECISIONS}, got {fp32_matmul_prec}")
        if tp_mode not in _TP_MODES:
            raise ValueError(f"tp_mode must be one of {_TP_MODES}, got {tp_mode}")
        if split_qkv and (is_qkv_fn is None or qkv_split_shapes is None or len(qkv_split_shapes) != 3):
            raise ValueError("split_qkv needs is_qkv_fn and qkv_split_shapes [q, k, v]")
        self.client = client
        self.nesterov = nesterov
        self.weight_decay_method = weight_decay_method
        self.fp32_matmul_prec = fp32_matmul_prec
        self.split_qkv = split_qkv
        self.is_qkv_fn = is_qkv_fn
        self.qkv_split_shapes = list(qkv_split_shapes) if qkv_split_shapes is not None else None
        self.tp_mode = tp_mode
        self.algorithm = algorithm
        self.job = job or os.environ.get("ORTHOSERVE_JOB") or "muon"
        self.timeout = timeout
        self.fallback = bool(fallback)
        self.ns_options: Dict[str, Any] = dict(
            coefficients=coefficient_type, steps=num_ns_steps, precision=fp32_matmul_prec, scale_mode=scale_mode,
            extra_scale=extra_scale_factor)
        if custom_coefficients is not None:
            self.ns_options["custom_coefficients"] = [tuple(t) for t in custom_coefficients]
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() < 2:
                    raise ValueError(f"Muon: parameters must have >= 2 dims, got shape {tuple(p.shape)}")
        self._remote_steps = 0
        self._names = {id(p): f"p{i}" for i, p in enumerate(q for g in self.param_groups for q in g["params"])}

    def _apply_weight_decay_inplace(self, p: torch.Tensor, grad: torch.Tensor, lr: float, wd: float) -> None:
        if wd == 0.0:
            return
        if self.weight_decay_method == "decoupled":
            p.add_(p, alpha=-wd * lr)
        elif self.weight_decay_method == "independent":
            p.add_(p, alpha=-wd)
        else:  # l2
            grad.add_(p, alpha=wd)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One optimizer step; the orthogonalization of all its parameters is one remote request."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        todo: List[Tuple[torch.Tensor, dict]] = []
        updates: List[torch.Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["momentum_buffer"] = torch.zeros_like(p)
                grad = p.grad
                self._apply_weight_decay_inplace(p, grad, group["lr"], group["weight_decay"])
                buf = state["momentum_buffer"]
                buf.lerp_(grad, 1 - group["momentum"])
                update = grad.lerp(buf, group["momentum"]) if self.nesterov else buf
                todo.append((p, group))
                updates.append(update)
        if todo:
            orth = self.orthogonalize_batch([p for p, _ in todo], updates)
            for (p, group), o in zip(todo, orth):
                p.add_(o, alpha=-group["lr"])
            self._remote_steps += 1
        return loss

    def _options_for(self, p: torch.Tensor) -> Dict[str, Any]:
        opts = dict(self.ns_options)
        if self.split_qkv and self.is_qkv_fn(p):
            opts["split_qkv"] = self.qkv_split_shapes
        return opts

    def orthogonalize_batch(self, params: List[torch.Tensor], updates: List[torch.Tensor]) -> List[torch.Tensor]:
        """The scaled orthogonalized update of each parameter (same type, dtype, shape as the update).

        Plain tensors (and DTensors that are not sharded) go whole in one stream; sharded DTensors go as one
        group step per shard group, each with this rank's local block."""
        results: List[Optional[torch.Tensor]] = [None] * len(params)
        whole: List[int] = []
        groups: Dict[Tuple[str, int, int], List[int]] = {}
        for i, p in enumerate(params):
            if is_dtensor(p) and _sharded_mesh_dims(p):
                groups.setdefault(dtensor_group(p, prefix="muon"), []).append(i)
            else:
                whole.append(i)
        if whole:
            tensors = [updates[i].to_local() if is_dtensor(updates[i]) else updates[i] for i in whole]
            opts = [dict(self._options_for(params[i]), name=self._names[id(params[i])]) for i in whole]
            try:
                out = self.client.orthogonalize_batch(tensors, opts, timeout=self.timeout)
            except errors.OrthoserveError as e:
                if not _falls_back(self.fallback, e, f"Muon step {self._remote_steps}"):
                    raise
                out = [_local(t, o) for t, o in zip(tensors, opts)]
            for i, o in zip(whole, out):
                results[i] = self._like(updates[i], o)
        for (name, rank, world), indices in groups.items():
            shards = []
            for i in indices:
                p = params[i]
                kwargs = self._options_for(p)
                mode = getattr(p, "tp_mode", None) or self.tp_mode
                if mode is not None:
                    kwargs.update(algorithm=f"tp_{mode}", partition_dim=_partition_dim(p))
                else:
                    kwargs.update(algorithm=getattr(p, "orthoserve_algorithm", None) or self.algorithm)
                local = updates[i].to_local() if is_dtensor(updates[i]) else updates[i]
                shards.append(dtensor_shard(self._names[id(p)], p, data=local, **kwargs))
            group = self.client.group(self.job, name, rank, world)
            out = group.step(self._remote_steps, shards, timeout=self.timeout)
            for i, o in zip(indices, out):
                results[i] = self._like(updates[i], o)
        return results  # type: ignore[return-value]

    @staticmethod
    def _like(update: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        if not is_dtensor(update):
            return local
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, update.device_mesh, update.placements, run_check=False,
                                  shape=update.shape, stride=update.stride())
