"""PyTorch integration: Emerging-Optimizers' `newton_schulz` run remotely, a `newton_schulz` callable, DTensor block
helpers and a remote Muon optimizer that takes Emerging-Optimizers' and torch.optim.Muon's arguments.

Which server: the `client` argument where there is one; otherwise the module's default client, set by
set_default_client(...), or else one made from the environment: ORTHOSERVE_ADDRESS (HOST:PORT, or several,
comma-separated, in failover order) and ORTHOSERVE_TOKEN (a bearer token, optional).

Muon follows NVIDIA Emerging-Optimizers 0.3.0 (OrthogonalizedOptimizer.step and Muon) step for step: weight
decay ("decoupled" p -= lr·wd·p, "independent" p -= wd·p, "l2" grad += wd·p), EMA momentum buf.lerp_(grad,
1 - momentum), Nesterov grad.lerp(buf, momentum) or the buffer itself, orthogonalize (NS, then the scale factor
and extra scale), p -= lr·update — which is also torch.optim.Muon's step (decoupled weight decay, an lr adjusted
by adjust_lr_fn instead of a scale factor). The orthogonalization of every parameter of a step is one remote
request (whole tensors in one stream; DTensor shards as one group step per shard group).

Same host: whole tensors, and this rank's blocks of group steps (sharded DTensors, tp_group), go through shared-memory
regions when the server rank they go to is on this host and takes regions (orthoserve.region_transport: `shm="auto"`
by default, True to require it, False for bytes; $ORTHOSERVE_SHM sets the default, and is the only switch of
newton_schulz). Results are bit for bit the same.

Group steps carry a run id (StepHeader.run_id; orthoserve.runs): Muon's `run_id=`, else $ORTHOSERVE_RUN_ID, else
$TORCHELASTIC_RUN_ID (torchrun), else a random id agreed over the default torch.distributed process group — a
collective that Muon's constructor makes, so construct Muon on every rank of the job, as training scripts do.
newton_schulz(tp_group=...) takes $ORTHOSERVE_RUN_ID / $TORCHELASTIC_RUN_ID or an id agreed before, else the random
key its tp_group agrees on first use (a collective of that group only).
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import os
import secrets
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised by the client-only install test
    raise ImportError("orthoserve.torch needs PyTorch, which is not installed (the orthoserve client itself does "
                      "not): pip install torch, or the package's extra: pip install 'orthoserve[torch]'") from e

from orthoserve import errors, layout, local_ns, options as options_lib, runs
from orthoserve.client import Client
from orthoserve.region_transport import RegionTransport

__all__ = ["newton_schulz", "set_default_client", "get_default_client", "region_transport", "RemoteNewtonSchulz",
           "Muon",
           "dtensor_block", "dtensor_group", "dtensor_shard", "is_dtensor", "ENV_ADDRESS", "ENV_TOKEN"]

_PRECISIONS = ("highest", "high", "medium")
_WEIGHT_DECAY_METHODS = ("decoupled", "independent", "l2")
_TP_MODES = (None, "duplicated", "distributed", "blockwise")
# Emerging-Optimizers 0.3.0's NSCoeffT (muon_utils): newton_schulz accepts these and "custom", nothing else.
_EO_COEFFICIENT_TYPES = ("simple", "quintic", "polar_express", "cans", "aol", "deepseekv4")

ENV_ADDRESS = "ORTHOSERVE_ADDRESS"
ENV_TOKEN = "ORTHOSERVE_TOKEN"

logger = logging.getLogger("orthoserve")


# -- the default client ------------------------------------------------------------------------------------

_default_lock = threading.Lock()
_default_client: Optional[Client] = None
# Clients made from the environment, by (pid, address, token): a forked child makes its own (gRPC channels do
# not survive a fork).
_env_clients: Dict[Tuple[int, str, Optional[str]], Client] = {}


def set_default_client(client: Any) -> None:
    """Sets the client that newton_schulz, and RemoteNewtonSchulz and Muon made without one, use: an
    orthoserve.Client, an address ("HOST:PORT") or a list of addresses (a Client with default settings is made),
    or None to go back to the environment (ORTHOSERVE_ADDRESS)."""
    global _default_client
    if client is not None and not isinstance(client, Client):
        if isinstance(client, str) or (isinstance(client, (list, tuple)) and all(isinstance(a, str) for a in client)):
            client = Client(client)
        else:
            raise TypeError(f"orthoserve.torch.set_default_client: expected an orthoserve.Client, an address or a "
                            f"list of addresses, or None; got {type(client).__name__}")
    with _default_lock:
        _default_client = client


def get_default_client() -> Client:
    """The client set by set_default_client, else one for $ORTHOSERVE_ADDRESS (comma-separated addresses) with
    $ORTHOSERVE_TOKEN as its bearer token (made once per process and address). RuntimeError when neither is set."""
    with _default_lock:
        if _default_client is not None:
            return _default_client
        address = os.environ.get(ENV_ADDRESS, "").strip()
        if not address:
            raise RuntimeError(
                "orthoserve.torch: no orthoserve server configured: call "
                "orthoserve.torch.set_default_client(orthoserve.Client('HOST:PORT')) or set the environment "
                f"variable {ENV_ADDRESS}=HOST:PORT (several: comma-separated; {ENV_TOKEN} for a bearer token)")
        token = os.environ.get(ENV_TOKEN) or None
        key = (os.getpid(), address, token)
        client = _env_clients.get(key)
        if client is None:
            addresses = [a.strip() for a in address.split(",") if a.strip()]
            client = _env_clients[key] = Client(addresses, token=token)
        return client


def _client_or_default(client: Optional[Client]) -> Client:
    return client if client is not None else get_default_client()


# The transports of newton_schulz, one per client (its regions are reused by the calls that go through that client,
# with and without tp_group).
_transports: "weakref.WeakKeyDictionary[Client, RegionTransport]" = weakref.WeakKeyDictionary()


def region_transport(client: Optional[Client] = None) -> RegionTransport:
    """The RegionTransport that newton_schulz uses with `client` (default: get_default_client()): its `transport`
    ("shm" or "bytes") and `reason` say how the last call went. Made on first use with shm=$ORTHOSERVE_SHM
    ("auto" when unset)."""
    client = _client_or_default(client)
    with _default_lock:
        transport = _transports.get(client)
        if transport is None:
            transport = _transports[client] = RegionTransport(None, what="orthoserve.torch.newton_schulz")
        return transport


# -- newton_schulz: Emerging-Optimizers' function, run by the service --------------------------------------

class _TpGroup:
    """What the ranks of one torch.distributed process group share for newton_schulz(tp_group=...): the group
    key (agreed once: group rank 0 draws it and broadcasts it), the run id of its steps, and the number of calls so
    far (the step number of the next group step; every rank makes the same calls in the same order, as with EO's
    collectives)."""

    __slots__ = ("name", "run_id", "calls")

    def __init__(self, name: str, run_id: str):
        self.name = name
        self.run_id = run_id
        self.calls = 0


_tp_groups: "weakref.WeakKeyDictionary[Any, _TpGroup]" = weakref.WeakKeyDictionary()
_tp_lock = threading.Lock()


def _tp_state(tp_group: Any, device: torch.device) -> _TpGroup:
    import torch.distributed as dist

    with _tp_lock:
        state = _tp_groups.get(tp_group)
    if state is not None:
        return state
    # Two random 62-bit words from group rank 0, the same on every rank of the group: a key no other group, and no
    # other run against the same fleet, uses (the server keys group steps by job, group and step number).
    words = torch.tensor([secrets.randbits(62), secrets.randbits(62)] if dist.get_rank(tp_group) == 0 else [0, 0],
                         dtype=torch.int64, device=device)
    dist.broadcast(words, group=tp_group, group_src=0)
    key = "".join(f"{int(w):016x}" for w in words.tolist())
    # The run id: $ORTHOSERVE_RUN_ID / $TORCHELASTIC_RUN_ID, or one agreed over the default group before (no new
    # collective here: not every rank of the default group need call newton_schulz with a tp_group), else the key
    # just agreed, which only this run's ranks of this group hold.
    run_id = runs.find_run_id(agree=False) or f"tp-{key}"
    state = _TpGroup(f"newton_schulz/tp{dist.get_world_size(tp_group)}/{key}", run_id)
    with _tp_lock:
        _tp_groups[tp_group] = state
    return state


def _newton_schulz_tp(x: torch.Tensor, opts: Dict[str, Any], partition_dim: int, tp_group: Any) -> torch.Tensor:
    """EO's distributed newton_schulz (tp_group set) as a TP_DISTRIBUTED group step of the group's ranks: this rank's
    `x` is its block of the matrix split along `partition_dim` (0: rows, 1: columns) in group-rank order."""
    import torch.distributed as dist

    rank, world = dist.get_rank(tp_group), dist.get_world_size(tp_group)
    state = _tp_state(tp_group, x.device)
    # The blocks' extents along the partition dim (the other dim must agree): the global shape and this offset.
    sizes = [torch.zeros(2, dtype=torch.int64, device=x.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor(list(x.shape), dtype=torch.int64, device=x.device), group=tp_group)
    shapes = [tuple(int(v) for v in s.tolist()) for s in sizes]
    other = 1 - partition_dim
    if any(s[other] != x.shape[other] for s in shapes):
        raise ValueError(f"orthoserve.torch.newton_schulz: the ranks of tp_group hold blocks of shapes {shapes}, "
                         f"which do not split one matrix along dim {partition_dim} (transpose="
                         f"{partition_dim == 0}: the blocks must split dim {partition_dim} and share dim {other})")
    total = sum(s[partition_dim] for s in shapes)
    before = sum(s[partition_dim] for s in shapes[:rank])
    global_shape = (total, x.shape[1]) if partition_dim == 0 else (x.shape[0], total)
    offset = (before, 0) if partition_dim == 0 else (0, before)
    step = state.calls
    state.calls += 1  # Counted before the call: a failed step's number is never used again.
    job = os.environ.get("ORTHOSERVE_JOB") or "orthoserve.torch"
    client = get_default_client()
    shard = layout.Shard("x", global_shape, offset, x, algorithm="tp_distributed", partition_dim=partition_dim,
                         **opts)
    group = client.group(job, state.name, rank, world, run_id=state.run_id)
    [out] = region_transport(client).group_step(group, step, [shard])
    return out


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
    $ORTHOSERVE_ADDRESS). Errors of the service raise orthoserve.OrthoserveError subclasses.
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
            return _newton_schulz_tp(x, opts, 0 if local_transpose else 1, tp_group)
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


# -- helpers -----------------------------------------------------------------------------------------------

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
        matrices = tensor.reshape(-1, *tensor.shape[-2:])
        if matrices.shape[0] == 0:
            return torch.empty_like(tensor)
        return torch.stack([local_ns.orthogonalize(t, **ns) for t in matrices]).reshape(tensor.shape)
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

    def batch(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Orthogonalizes many 2-D or 3-D (batched) tensors in one request."""
        for x in tensors:
            if x.ndim < 2 or x.ndim > 3:  # Emerging-Optimizers' newton_schulz: the same check and exception type.
                raise TypeError(f"Input tensor x must be 2d or 3d (batched 2d), got {x.ndim}d")
        opts = self._options()
        try:
            return self.region_transport.orthogonalize_batch(_client_or_default(self.client), list(tensors),
                                                             [opts] * len(tensors), nd="batch")
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

class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()

# Arguments only one of the two optimizers has: they tell whose defaults the rest take (flavor None).
_EO_ONLY = ("weight_decay_method", "fp32_matmul_prec", "coefficient_type", "num_ns_steps", "scale_mode",
            "extra_scale_factor")
_TORCH_ONLY = ("ns_coefficients", "ns_steps", "adjust_lr_fn")
# torch.optim.Muon's default NS coefficients (Keller Jordan's triple; EO's "simple").
_TORCH_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Every param group holds these (defaults from the flavor, then the constructor's arguments, then the group's).
_FLAVOR_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # emerging_optimizers.orthogonalized_optimizers.Muon 0.3.0
    "eo": dict(lr=3e-4, momentum=0.95, weight_decay=0.01, nesterov=False, weight_decay_method="decoupled",
               fp32_matmul_prec="medium", coefficient_type="quintic", ns_coefficients=None, ns_steps=5, eps=1e-7,
               scale_mode="spectral", extra_scale_factor=1.0, adjust_lr_fn="none", use_syrk=False),
    # torch.optim.Muon (torch 2.15): bf16 NS (= "medium"), no scale factor, lr adjusted by adjust_lr_fn.
    "torch": dict(lr=1e-3, momentum=0.95, weight_decay=0.1, nesterov=True, weight_decay_method="decoupled",
                  fp32_matmul_prec="medium", coefficient_type="custom", ns_coefficients=_TORCH_NS_COEFFICIENTS,
                  ns_steps=5, eps=1e-7, scale_mode="none", extra_scale_factor=1.0, adjust_lr_fn=None,
                  use_syrk=False),
}
_ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped", "none")
_MAX_NS_STEPS = 100


# Muon's default job: "muon-<run id>", or a digest of a run id too long to be read in a job name.
_MAX_READABLE_RUN_ID = 64


def _default_job(run_id: str) -> str:
    """Muon's job for run `run_id` when none is given: one per run."""
    if len(run_id.encode()) <= _MAX_READABLE_RUN_ID:
        return f"muon-{run_id}"
    return f"muon-{hashlib.sha256(run_id.encode()).hexdigest()[:32]}"


def _triples(value: Any) -> List[Tuple[float, float, float]]:
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


def _lr_ratio(adjust_lr_fn: Optional[str], rows: int, cols: int) -> float:
    """torch.optim.Muon's _adjust_lr factor for a rows x cols parameter; "none": 1 (Emerging-Optimizers)."""
    if adjust_lr_fn == "none":
        return 1.0
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(rows / cols)  # spectral_unclamped


class Muon(torch.optim.Optimizer):
    """Muon with the orthogonalization done by an orthoserve fleet; takes Emerging-Optimizers' and torch.optim.Muon's
    arguments, so that either can be replaced by it in a training script.

    Emerging-Optimizers 0.3.0 (`emerging_optimizers.orthogonalized_optimizers.Muon`) arguments and defaults:
      lr 3e-4, momentum 0.95, weight_decay 0.01 (positional in this order after params, as EO's), nesterov False,
      weight_decay_method "decoupled" | "independent" | "l2", fp32_matmul_prec "medium" | "high" | "highest" (the
      server's precision), coefficient_type (simple, quintic, polar_express, aol, cans, deepseekv4, cubic5,
      custom), num_ns_steps 5, scale_mode "spectral" | "shape_scaling" | "unit_rms_norm" | "none",
      extra_scale_factor 1.0, use_syrk (accepted; the server picks its own kernels, the numbers do not change).
    torch.optim.Muon (torch 2.15) arguments and defaults (pass them by keyword: torch's positional order after lr
      differs from EO's): lr 1e-3, weight_decay 0.1 (decoupled: p *= 1 - lr·wd), momentum 0.95, nesterov True,
      ns_coefficients (3.4445, -4.775, 2.0315) — one (a, b, c) used at every step, or a list of triples (cycled) —
      eps 1e-7 (x / max(‖x‖, eps)), ns_steps 5, adjust_lr_fn None (= "original": lr·√max(1, rows/cols)) |
      "match_rms_adamw" (lr·0.2·√max(rows, cols)) | "spectral_unclamped" (lr·√(rows/cols)); no scale factor. Its
      NS runs in bf16: here fp32_matmul_prec "medium" (fp32 normalization, bf16 products; docs/numerics.md).
    flavor: whose defaults the arguments not given take: "eo" or "torch"; None decides from the arguments given:
      torch.optim.Muon's own (ns_coefficients, ns_steps, adjust_lr_fn) give "torch", otherwise "eo". TypeError when
      arguments that only EO has and arguments that only torch has are mixed without a flavor. Either way every
      setting may be given: eps and adjust_lr_fn ("none": no adjustment, EO's behaviour) with EO's, scale_mode
      with torch's.
    Per parameter group: every setting above (lr, momentum, weight_decay, nesterov, weight_decay_method,
      fp32_matmul_prec, coefficient_type, ns_coefficients, ns_steps / num_ns_steps, eps, scale_mode,
      extra_scale_factor, adjust_lr_fn, use_syrk) may be set in a param group dict, as torch.optim.Muon allows;
      a group that gives ns_coefficients without a coefficient_type uses them ("custom").
    orthoserve's own:
      custom_coefficients: coefficient_type "custom"'s triples (the same as ns_coefficients).
      split_qkv, is_qkv_fn, qkv_split_shapes: as MindSpeed's TensorParallelMuon: parameters for which
        is_qkv_fn(p) is true are orthogonalized per Q, K and V ([q, k, v] rows per query group).
      client: an orthoserve.Client; None: orthoserve.torch.get_default_client() at each step
        (set_default_client(...) or $ORTHOSERVE_ADDRESS).
      run_id: the run id of its group steps (StepHeader.run_id), the same on every rank of this run and no other
        run's; None: $ORTHOSERVE_RUN_ID, else $TORCHELASTIC_RUN_ID (torchrun), else — when torch.distributed is
        initialized — a random id agreed over the default process group, in this constructor: a COLLECTIVE, so
        construct Muon on every rank of the job at the same point (as training scripts do), or give run_id /
        $ORTHOSERVE_RUN_ID. A Muon with no run id still steps whole tensors; its first group step (a sharded
        DTensor) tries the agreement again and raises ValueError when there is none. Kept in `run_id`.
      job: the trainer job id for group steps (default $ORTHOSERVE_JOB, else "muon-<run id>": unique per run, so
        that two runs of one script, e.g. a sweep, never meet on a step). With an explicit job shared by two runs
        the fleet still never mixes them (steps are keyed by run too) but refuses the later of two that meet on
        the same step (FAILED_PRECONDITION), so give each run its own job. Kept in `job` (None until the run id is
        known).
      tp_mode: None (DTensors by the "auto" algorithm), "duplicated", "distributed" or "blockwise" (TP
        algorithms for sharded DTensors); a parameter's own `tp_mode` attribute overrides it.
      algorithm: the algorithm for sharded DTensors when no TP mode applies (default "auto"); a parameter's
        own `orthoserve_algorithm` attribute overrides it.
      timeout: deadline in seconds of each attempt of a remote call (the client's RetryPolicy bounds them all).
      fallback: when the service stays unreachable (a retryable failure that outlasted the client's retries),
        orthogonalize the whole (non-DTensor-sharded) parameters locally (orthoserve.local_ns) with a warning,
        instead of raising. Off by default. Sharded DTensor group steps have no local fallback: their error
        propagates.
      shm: "auto" (default; None: $ORTHOSERVE_SHM, else "auto"), True or False: whether the updates go through
        shared-memory regions when the server rank they go to is on this host and takes regions: the whole
        parameters' through one region, this rank's blocks of sharded DTensors through one region on each member
        its group steps go to (orthoserve.region_transport; auto falls back to bytes, logged at INFO, and True
        raises FailedPreconditionError instead). Each region is sized for the step and reused by the next ones.
        Results are bit for bit those of bytes. `transport` says how the step's last call (its last group step,
        when it has any) went ("shm" or "bytes"), `region_transport` more.
    Unknown arguments raise TypeError; bad values ValueError (torch's messages where torch checks the same).
    Parameters must have >= 2 dims (N-d: viewed as shape[0] x prod(rest), also for adjust_lr_fn). DTensor
    parameters are sent as group steps of their mesh's shard group, each rank only its local shard; plain tensors
    go whole from each rank. step(closure) calls the closure (with grad enabled) and returns its loss.
    """

    def __init__(self, params: Iterable[Any], lr: Any = None, momentum: Optional[float] = None,
                 weight_decay: Optional[float] = None, *, nesterov: Optional[bool] = None,
                 weight_decay_method: Optional[str] = None, fp32_matmul_prec: Optional[str] = None,
                 coefficient_type: Optional[str] = None, num_ns_steps: Optional[int] = None,
                 scale_mode: Optional[str] = None, extra_scale_factor: Optional[float] = None,
                 use_syrk: Optional[bool] = None, ns_coefficients: Any = None, ns_steps: Optional[int] = None,
                 eps: Optional[float] = None, adjust_lr_fn: Any = _UNSET,
                 custom_coefficients: Optional[Sequence[Tuple[float, float, float]]] = None,
                 split_qkv: bool = False, is_qkv_fn: Optional[Callable[[torch.Tensor], bool]] = None,
                 qkv_split_shapes: Optional[Sequence[int]] = None, tp_mode: Optional[str] = None,
                 algorithm: str = "auto", client: Optional[Client] = None, job: Optional[str] = None,
                 timeout: Optional[float] = None, fallback: bool = False, flavor: Optional[str] = None,
                 run_id: Optional[str] = None, shm: Any = None):
        if isinstance(lr, Client):
            raise TypeError("Muon: pass the client by keyword (client=...); the second positional argument is lr")
        given = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                     weight_decay_method=weight_decay_method, fp32_matmul_prec=fp32_matmul_prec,
                     coefficient_type=coefficient_type, num_ns_steps=num_ns_steps, scale_mode=scale_mode,
                     extra_scale_factor=extra_scale_factor, use_syrk=use_syrk, ns_coefficients=ns_coefficients,
                     ns_steps=ns_steps, eps=eps, adjust_lr_fn=adjust_lr_fn)
        given = {k: v for k, v in given.items() if v is not None and v is not _UNSET}
        if adjust_lr_fn is None:
            given["adjust_lr_fn"] = None  # Given as None: torch's "original".
        if flavor is None:
            eo_given = [k for k in _EO_ONLY if k in given]
            torch_given = [k for k in _TORCH_ONLY if k in given]
            if eo_given and torch_given:
                raise TypeError(f"Muon: {torch_given} are torch.optim.Muon's arguments and {eo_given} Emerging-"
                                "Optimizers' Muon's; pass flavor='torch' or flavor='eo' to say whose defaults the "
                                "other arguments take")
            flavor = "torch" if torch_given else "eo"
        if flavor not in _FLAVOR_DEFAULTS:
            raise ValueError(f"Muon: flavor must be 'eo', 'torch' or None, got {flavor!r}")
        if custom_coefficients is not None:
            if "ns_coefficients" in given:
                raise TypeError("Muon: give custom_coefficients or ns_coefficients, not both")
            given["ns_coefficients"] = custom_coefficients
        if tp_mode not in _TP_MODES:
            raise ValueError(f"tp_mode must be one of {_TP_MODES}, got {tp_mode}")
        if split_qkv and (is_qkv_fn is None or qkv_split_shapes is None or len(qkv_split_shapes) != 3):
            raise ValueError("split_qkv needs is_qkv_fn and qkv_split_shapes [q, k, v]")
        self.flavor = flavor
        self.client = client
        self.split_qkv = split_qkv
        self.is_qkv_fn = is_qkv_fn
        self.qkv_split_shapes = list(qkv_split_shapes) if qkv_split_shapes is not None else None
        self.tp_mode = tp_mode
        self.algorithm = algorithm
        # The run id now, while every rank is here (the agreement over torch.distributed is a collective).
        self.run_id: Optional[str] = runs.find_run_id(run_id, agree=True)
        self._job = job or os.environ.get("ORTHOSERVE_JOB") or None
        self.timeout = timeout
        self.fallback = bool(fallback)
        self.region_transport = RegionTransport(shm, what="Muon")
        self._names: Dict[int, str] = {}
        self._group_of: Dict[int, dict] = {}
        self._remote_steps = 0
        defaults = dict(_FLAVOR_DEFAULTS[flavor])
        defaults.update(self._canonical(given))
        self._check(defaults, "Muon")
        super().__init__(params, defaults)

    @property
    def transport(self) -> Optional[str]:
        """How the last step's last call went (its whole parameters, or its last group step when it has any): "shm"
        (a shared-memory region), "bytes", or None before the first step (region_transport.reason says why bytes)."""
        return self.region_transport.transport

    @property
    def job(self) -> Optional[str]:
        """The job of this optimizer's group steps: the explicit job or $ORTHOSERVE_JOB, else "muon-<run id>"
        (None while there is no run id)."""
        if self._job is not None:
            return self._job
        return None if self.run_id is None else _default_job(self.run_id)

    def _group_identity(self) -> Tuple[str, str]:
        """(job, run id) of a group step; the run id resolved now if the constructor found none. ValueError when
        there is none."""
        if self.run_id is None:
            self.run_id = runs.resolve_run_id(None, what="Muon's group step of sharded DTensor parameters")
        return self.job, self.run_id  # type: ignore[return-value]

    # -- settings ------------------------------------------------------------------------------------------

    @staticmethod
    def _canonical(settings: Dict[str, Any]) -> Dict[str, Any]:
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

    @staticmethod
    def _check(group: Dict[str, Any], where: str) -> None:
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
            _triples(group["ns_coefficients"])
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
        if group["adjust_lr_fn"] not in _ADJUST_LR_FNS:
            raise ValueError(f"Adjust learning rate function {group['adjust_lr_fn']} is not supported")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch.optim.Optimizer.add_param_group, with Muon's settings per group (aliases resolved, values
        checked) and parameters of >= 2 dims."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = self._canonical(param_group)
        self._check({**self.defaults, **{k: v for k, v in group.items() if k != "params"}}, "Muon param group")
        super().add_param_group(group)
        for p in self.param_groups[-1]["params"]:
            if p.dim() < 2:
                raise ValueError(f"Muon: parameters must have >= 2 dims, got shape {tuple(p.shape)}")
            self._names.setdefault(id(p), f"p{len(self._names)}")

    @staticmethod
    def _setting(group: Dict[str, Any], defaults: Dict[str, Any], key: str) -> Any:
        # A group loaded from another optimizer's state_dict (torch.optim.Muon's) may lack our keys.
        return group[key] if key in group else defaults[key]

    def _group_settings(self, group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: self._setting(group, self.defaults, k) for k in _FLAVOR_DEFAULTS["eo"]}

    # -- the step ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One optimizer step; the orthogonalization of all its parameters is one remote request.

        Nothing the step changes (parameters, momentum buffers, an l2 weight decay's gradients, the step count) is
        touched until every orthogonalized update is in hand: the new momentum buffers and gradients are computed
        into new tensors first, and written, with the weight decay and the update, only after the remote call
        returned. A step that raises (the service unreachable after the retries, an error answer, an integrity
        failure, a bad parameter) leaves parameters and optimizer state exactly as they were, so calling step()
        again after an exception is the same as calling it once."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        todo: List[Tuple[torch.Tensor, Dict[str, Any]]] = []
        updates: List[torch.Tensor] = []
        pending: List[Tuple[Optional[torch.Tensor], torch.Tensor]] = []  # (new gradient or None, new buffer) per p.
        group_of: Dict[int, Dict[str, Any]] = {}
        for group in self.param_groups:
            settings = self._group_settings(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if torch.is_complex(p):
                    raise RuntimeError("Muon does not support complex parameters")
                if p.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                grad = p.grad
                new_grad = None
                if settings["weight_decay"] != 0.0 and settings["weight_decay_method"] == "l2":
                    new_grad = grad = grad.add(p, alpha=settings["weight_decay"])
                buf = self.state[p].get("momentum_buffer") if p in self.state else None
                if buf is None:
                    buf = torch.zeros_like(p)
                buf = buf.lerp(grad, 1 - settings["momentum"])
                update = grad.lerp(buf, settings["momentum"]) if settings["nesterov"] else buf
                group_of[id(p)] = settings
                todo.append((p, settings))
                updates.append(update)
                pending.append((new_grad, buf))
        self._group_of = group_of
        if not todo:
            return loss
        orth = self.orthogonalize_batch([p for p, _ in todo], updates)
        # Every update is known: apply the step (the same operations, in the same order, as an in-place step).
        for (p, settings), (new_grad, buf), o in zip(todo, pending, orth):
            lr, wd = float(settings["lr"]), settings["weight_decay"]
            if new_grad is not None:
                p.grad.copy_(new_grad)
            elif wd != 0.0:
                p.add_(p, alpha=-wd * lr if settings["weight_decay_method"] == "decoupled" else -wd)
            state = self.state[p]
            if "momentum_buffer" in state:
                state["momentum_buffer"].copy_(buf)
            else:
                state["momentum_buffer"] = buf
            rows = p.shape[0]
            cols = math.prod(p.shape[1:])
            p.add_(o, alpha=-lr * _lr_ratio(settings["adjust_lr_fn"], rows, cols))
        self._remote_steps += 1
        return loss

    def _options_for(self, p: torch.Tensor) -> Dict[str, Any]:
        """The server's NS options for parameter p: its param group's settings (orthoserve.options names)."""
        settings = self._group_of.get(id(p))
        if settings is None:
            group = next((g for g in self.param_groups if any(q is p for q in g["params"])), self.param_groups[0])
            settings = self._group_settings(group)
        opts: Dict[str, Any] = dict(coefficients=settings["coefficient_type"], steps=settings["ns_steps"],
                                    precision=settings["fp32_matmul_prec"], eps=float(settings["eps"]),
                                    scale_mode=settings["scale_mode"],
                                    extra_scale=float(settings["extra_scale_factor"]))
        if settings["coefficient_type"] == "custom":
            opts["custom_coefficients"] = _triples(settings["ns_coefficients"])
        if self.split_qkv and self.is_qkv_fn(p):
            opts["split_qkv"] = self.qkv_split_shapes
        return opts

    def orthogonalize_batch(self, params: List[torch.Tensor], updates: List[torch.Tensor]) -> List[torch.Tensor]:
        """The orthogonalized (and scaled, per scale_mode and extra_scale_factor) update of each parameter (same
        type, dtype, shape as the update).

        Plain tensors (and DTensors that are not sharded) go whole in one stream; sharded DTensors go as one
        group step per shard group, each with this rank's local block; either through shared-memory regions by
        `shm` (region_transport)."""
        results: List[Optional[torch.Tensor]] = [None] * len(params)
        whole: List[int] = []
        groups: Dict[Tuple[str, int, int], List[int]] = {}
        for i, p in enumerate(params):
            if is_dtensor(p) and _sharded_mesh_dims(p):
                groups.setdefault(dtensor_group(p, prefix="muon"), []).append(i)
            else:
                whole.append(i)
        client = _client_or_default(self.client) if params else None
        job, run_id = self._group_identity() if groups else ("", "")
        if whole:
            tensors = [updates[i].to_local() if is_dtensor(updates[i]) else updates[i] for i in whole]
            opts = [dict(self._options_for(params[i]), name=self._names.get(id(params[i]), f"p{i}")) for i in whole]
            try:
                out = self.region_transport.orthogonalize_batch(client, tensors, opts, timeout=self.timeout)
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
                shards.append(dtensor_shard(self._names.get(id(p), f"p{i}"), p, data=local, **kwargs))
            group = client.group(job, name, rank, world, run_id=run_id)
            out = self.region_transport.group_step(group, self._remote_steps, shards, timeout=self.timeout)
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
