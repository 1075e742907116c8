"""Muon with the orthogonalization done by an orthoserve fleet (the class docstring): the optimizer's arithmetic step
for step as Emerging-Optimizers 0.3.0's and torch.optim.Muon's (orthoserve.torch's docstring), its settings checked by
orthoserve.torch.muon_settings, and every step's updates orthogonalized in one remote request by
orthoserve.torch.updates — or, overlapped with backward, in buckets sent by orthoserve.torch.overlap as each
parameter's gradient is final, with the same numbers."""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from orthoserve import runs
from orthoserve.client import Client
from orthoserve.region_transport import RegionTransport
from orthoserve.torch import muon_settings as settings_lib
from orthoserve.torch import param_names
from orthoserve.torch.muon_update import inputs_of, momentum_update
from orthoserve.torch.overlap import Made, Overlap, OverlapStats, overlap_options
from orthoserve.torch.updates import orthogonalize_updates

__all__ = ["Muon"]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


# The weight decay p += alpha·p of Emerging-Optimizers' methods (its WeightDecayMixin), "l2" aside (it decays the
# gradient instead).
_DECAY_ALPHA: Dict[str, Callable[[float, float], float]] = {
    "decoupled": lambda lr, wd: -wd * lr,
    "independent": lambda lr, wd: -wd,
    "palm": lambda lr, wd: -(wd * lr * lr),
}


# Muon's default job: "muon-<run id>", or a digest of a run id too long to be read in a job name.
_MAX_READABLE_RUN_ID = 64


def _default_job(run_id: str) -> str:
    """Muon's job for run `run_id` when none is given: one per run."""
    if len(run_id.encode()) <= _MAX_READABLE_RUN_ID:
        return f"muon-{run_id}"
    return f"muon-{hashlib.sha256(run_id.encode()).hexdigest()[:32]}"


class Muon(torch.optim.Optimizer):
    """Muon by an orthoserve fleet: Emerging-Optimizers' Muon unless flavor="torch" or torch.optim.Muon's own arguments
    (ns_coefficients, ns_steps, adjust_lr_fn) are given, which make it torch.optim.Muon's.

    For an import swap, use the classes with each anchor's exact signature instead: orthoserve.torch.optim.Muon for
    `torch.optim.Muon`, orthoserve.torch.eo.Muon for Emerging-Optimizers' (docs/numerics.md, "Drop-ins"). This one
    takes both optimizers' arguments (EO's positional order).

    Emerging-Optimizers 0.3.0 (`emerging_optimizers.orthogonalized_optimizers.Muon`) arguments and defaults:
      lr 3e-4, momentum 0.95, weight_decay 0.01 (positional in this order after params, as EO's), nesterov False,
      weight_decay_method "decoupled" | "independent" | "l2" | "palm" (p·lr²·wd), fp32_matmul_prec "medium" |
      "high" | "highest" (the server's precision), coefficient_type (simple, quintic, polar_express, aol, cans,
      deepseekv4, cubic5, custom), num_ns_steps 5, scale_mode "spectral" | "shape_scaling" | "unit_rms_norm" | "none",
      extra_scale_factor 1.0, use_syrk (accepted; the server picks its own kernels, the numbers do not change).
    torch.optim.Muon (torch 2.15) arguments and defaults (pass them by keyword: torch's positional order after lr
      differs from EO's): lr 1e-3, weight_decay 0.1 (decoupled: p *= 1 - lr·wd), momentum 0.95, nesterov True,
      ns_coefficients (3.4445, -4.775, 2.0315) — one (a, b, c) used at every step, or a list of triples (cycled) —
      eps 1e-7 (x / max(‖x‖, eps)), ns_steps 5, adjust_lr_fn None (= "original": lr·√max(1, rows/cols)) |
      "match_rms_adamw" (lr·0.2·√max(rows, cols)) | "spectral_unclamped" (lr·√(rows/cols)); no scale factor. Its
      NS runs in bf16: here fp32_matmul_prec "medium" with normalization "bf16" (the update rounded to bf16, then
      normalized in bf16, as torch does; docs/numerics.md), and its decoupled weight decay is p·(1 − lr·wd).
    flavor: whose defaults the arguments not given take: "eo" or "torch"; None decides from the arguments given:
      torch.optim.Muon's own (ns_coefficients, ns_steps, adjust_lr_fn) give "torch", otherwise "eo". TypeError when
      arguments that only EO has and arguments that only torch has are mixed without a flavor. Either way every
      setting may be given: eps and adjust_lr_fn ("none": no adjustment, EO's behaviour) with EO's, scale_mode
      with torch's.
    Per parameter group: every setting above (lr, momentum, weight_decay, nesterov, weight_decay_method,
      fp32_matmul_prec, coefficient_type, ns_coefficients, ns_steps / num_ns_steps, eps, scale_mode,
      extra_scale_factor, adjust_lr_fn, use_syrk) and nd may be set in a param group dict, as torch.optim.Muon allows;
      a group that gives ns_coefficients without a coefficient_type uses them ("custom").
    orthoserve's own:
      normalization: where the server's normalization rounds: "fp32" (Emerging-Optimizers') or "bf16"
        (torch.optim.Muon's order; needs fp32_matmul_prec "medium"); None (default): "bf16" for the torch flavor at
        "medium", else "fp32". Also per param group.
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
      overlap: True, False, an orthoserve.torch.OverlapOptions(bucket_bytes=1 MiB, in_flight=2), or None (default:
        $ORTHOSERVE_OVERLAP, 0 or 1; unset: on). On: each plain (non-DTensor) parameter's update is computed by a
        post-accumulate-grad hook as soon as its gradient is final and sent during backward, in buckets of about
        bucket_bytes (one client call each, at most in_flight at once, on background threads; the last bucket when
        backward ends), and step() waits only for what is still out. A result is used only when the update it was
        computed from is exactly what step() computes (the gradient, parameter and momentum buffer unchanged — same
        tensors, same version counters — and the same settings but lr): otherwise (accumulation over micro-batches,
        clip_grad_norm_, zero_grad, a closure, a second backward, a changed momentum) step() computes it and sends it
        in its own call, as does a failed early send (then retried, fallen back or raised as without overlap). So the
        numbers are bit for bit those without overlap, and a step that raises still changes nothing. Not overlapped,
        the synchronous path as before: DTensor parameters (sharded or not), and every parameter while
        torch.distributed is initialized (DDP writes its averaged gradient after the hook; FSDP2's are DTensors).
        After a step that could use none of its early results the hooks rest 1, 2, 4, ... up to 64 steps before they
        try again (a loop that clips every gradient). `overlap_stats` counts what was sent and used; `no_overlap()`
        pauses it (all but the last micro-batch of gradient accumulation).
        Until step(), each early update holds its new momentum buffer (and with Nesterov the update, with l2 the
        decayed gradient): one to three times the Muon parameters' bytes, from backward on instead of in step().
    params: tensors, (name, tensor) pairs (`model.named_parameters()`), or param group dicts whose "params" are
      either (not both), as torch.optim's optimizers take them. A parameter's matrix name on the wire
      (MatrixSpec.name, in the server's errors and logs) is its name ("layers.3.attn.qkv.weight"; "p<n>" without
      one), made unique within the optimizer ("name#2" for a second parameter of the same name) and, when longer
      than the server's Limits.max_name_bytes, shortened to fit with a hash of the whole name
      (orthoserve.torch.param_names).
    nd: how parameters of >= 3 dims are orthogonalized (also per param group; a parameter's own `orthoserve_nd`
      attribute wins): "flatten" (default) as one shape[0] x prod(rest) matrix; "batch" as prod(shape[:-2])
      independent shape[-2] x shape[-1] matrices (stacked experts (E, out, in): E matrices, as Emerging-Optimizers'
      newton_schulz does with a 3-D tensor), the scale factor and adjust_lr_fn of one such matrix. Sharded DTensors
      take "flatten" only (ValueError at the step otherwise).
    Unknown arguments raise TypeError; bad values ValueError (torch's messages where torch checks the same).
    Parameters must have >= 2 dims (N-d: viewed as shape[0] x prod(rest), also for adjust_lr_fn, unless nd is
    "batch"). DTensor parameters are sent as group steps of their mesh's shard group, each rank only its local
    shard; plain tensors go whole from each rank. step(closure) calls the closure (with grad enabled) and returns
    its loss.
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
                 run_id: Optional[str] = None, shm: Any = None, nd: Optional[str] = None,
                 normalization: Optional[str] = None, overlap: Any = None):
        if isinstance(lr, Client):
            raise TypeError("Muon: pass the client by keyword (client=...); the second positional argument is lr")
        given = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                     weight_decay_method=weight_decay_method, fp32_matmul_prec=fp32_matmul_prec,
                     coefficient_type=coefficient_type, num_ns_steps=num_ns_steps, scale_mode=scale_mode,
                     extra_scale_factor=extra_scale_factor, use_syrk=use_syrk, ns_coefficients=ns_coefficients,
                     ns_steps=ns_steps, eps=eps, adjust_lr_fn=adjust_lr_fn, nd=nd, normalization=normalization)
        given = {k: v for k, v in given.items() if v is not None and v is not _UNSET}
        if adjust_lr_fn is None:
            given["adjust_lr_fn"] = None  # Given as None: torch's "original".
        flavor = settings_lib.flavor_of(flavor, given)
        if custom_coefficients is not None:
            if "ns_coefficients" in given:
                raise TypeError("Muon: give custom_coefficients or ns_coefficients, not both")
            given["ns_coefficients"] = custom_coefficients
        if tp_mode not in settings_lib.TP_MODES:
            raise ValueError(f"tp_mode must be one of {settings_lib.TP_MODES}, got {tp_mode}")
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
        self._nd_of: Dict[int, str] = {}  # Each parameter's nd in the current step (settings_lib.nd_of).
        self._remote_steps = 0
        self._where: Dict[int, Tuple[int, int]] = {}  # id(p) -> (group index, position): _group_for's cache.
        options = overlap_options(overlap)
        # Made before super().__init__, whose add_param_group calls hook the parameters.
        self._overlap: Optional[Overlap] = (Overlap(options, self._early_update, self._send_early, what="Muon")
                                            if options is not None else None)
        defaults = dict(settings_lib.FLAVOR_DEFAULTS[flavor])
        defaults.update(settings_lib.canonical(given))
        settings_lib.check(defaults, "Muon")
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

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch.optim.Optimizer.add_param_group, with Muon's settings per group (aliases resolved, values
        checked) and parameters of >= 2 dims. Atomic: a group that fails a check (a bad setting, a parameter of
        < 2 dims, torch's own checks) raises and leaves the optimizer as it was."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = settings_lib.canonical(param_group)
        settings_lib.check({**self.defaults, **{k: v for k, v in group.items() if k != "params"}}, "Muon param group")
        params = group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif not isinstance(params, set):  # A set: torch's TypeError, before anything changes.
            params = list(params)  # Read once: an iterator is consumed here, not by the checks below.
            for item in params:
                name, p = item if isinstance(item, tuple) and len(item) == 2 else ("", item)
                if isinstance(p, torch.Tensor) and p.dim() < 2:
                    raise ValueError(f"Muon: parameters must have >= 2 dims, got shape {tuple(p.shape)}"
                                     + (f" ({name})" if name else ""))
        group["params"] = params
        # torch's checks (tensors, leaves, duplicates across groups) all come before it appends the group; it
        # moves the names of (name, tensor) pairs to the group's "param_names".
        super().add_param_group(group)
        added = self.param_groups[-1]
        given = added.get("param_names")
        taken = set(self._names.values())
        for j, p in enumerate(added["params"]):
            if id(p) not in self._names:
                self._names[id(p)] = param_names.unique_name(str(given[j]) if given else f"p{len(self._names)}", taken)
                taken.add(self._names[id(p)])
        if self._overlap is not None:
            self._overlap.watch(added["params"])

    @staticmethod
    def _setting(group: Dict[str, Any], defaults: Dict[str, Any], key: str) -> Any:
        # A group loaded from another optimizer's state_dict (torch.optim.Muon's) may lack our keys.
        return group[key] if key in group else defaults[key]

    def _group_settings(self, group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: self._setting(group, self.defaults, k) for k in settings_lib.FLAVOR_DEFAULTS["eo"]}

    # -- the step ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One optimizer step; the orthogonalization of all its parameters is one remote request, or, with overlap,
        the buckets sent during backward plus one request for the rest.

        Nothing the step changes (parameters, momentum buffers, an l2 weight decay's gradients, the step count) is
        touched until every orthogonalized update is in hand: the new momentum buffers and gradients are computed
        into new tensors first, and written, with the weight decay and the update, only after the remote call
        returned. A step that raises (the service unreachable after the retries, an error answer, an integrity
        failure, a bad parameter) leaves parameters and optimizer state exactly as they were, so calling step()
        again after an exception is the same as calling it once.

        Overlap (orthoserve.torch.overlap): a parameter whose update was computed and sent during backward, from
        exactly what this step would compute it from, takes that update and its result (waiting for its bucket);
        every other parameter, and any whose early send failed, is computed here and sent in this step's own call.
        The numbers are the same either way, bit for bit."""
        try:
            return self._step(closure)
        finally:
            if self._overlap is not None:
                self._overlap.end_step()

    def _step(self, closure: Optional[Callable[[], float]]) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        overlap = self._overlap
        todo: List[Tuple[torch.Tensor, Dict[str, Any]]] = []
        updates: List[torch.Tensor] = []
        pending: List[Tuple[Optional[torch.Tensor], torch.Tensor]] = []  # (new gradient or None, new buffer) per p.
        early: List[Any] = []  # Per p: its claimed orthoserve.torch.overlap.Early, or None.
        group_of: Dict[int, Dict[str, Any]] = {}
        nd_of: Dict[int, str] = {}
        if overlap is not None:
            overlap.flush()
        try:
            for group in self.param_groups:
                settings = self._group_settings(group)
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if torch.is_complex(p):
                        raise RuntimeError("Muon does not support complex parameters")
                    if p.grad.is_sparse:
                        raise RuntimeError("Muon does not support sparse gradients")
                    nd = nd_of[id(p)] = settings_lib.nd_of(p, settings["nd"])
                    buf = self.state[p].get("momentum_buffer") if p in self.state else None
                    claimed = None
                    if overlap is not None:
                        claimed = overlap.claim(p, lambda: inputs_of(p, buf, settings,
                                                                     self._ns_options(p, settings, nd)))
                    if claimed is not None:
                        new_grad, new_buf, update = claimed.new_grad, claimed.new_buf, claimed.update
                    else:
                        new_grad, new_buf, update = momentum_update(p, p.grad, buf, settings)
                    group_of[id(p)] = settings
                    todo.append((p, settings))
                    updates.append(update)
                    pending.append((new_grad, new_buf))
                    early.append(claimed)
        finally:
            if overlap is not None:
                overlap.discard()
        self._group_of = group_of
        self._nd_of = nd_of
        if not todo:
            return loss
        orth: List[Optional[torch.Tensor]] = [None if e is None else overlap.result(e)  # type: ignore[union-attr]
                                              for e in early]
        redo = [i for i, o in enumerate(orth) if o is None]
        if redo:
            got = self.orthogonalize_batch([todo[i][0] for i in redo], [updates[i] for i in redo])
            for i, o in zip(redo, got):
                orth[i] = o
        # Every update is known: apply the step (the same operations, in the same order, as an in-place step).
        for (p, settings), (new_grad, buf), o in zip(todo, pending, orth):
            lr, wd = float(settings["lr"]), settings["weight_decay"]
            if new_grad is not None:
                p.grad.copy_(new_grad)
            elif wd != 0.0 and self.flavor == "torch" and settings["weight_decay_method"] == "decoupled":
                p.mul_(1 - lr * wd)  # torch.optim.Muon's form (one rounding of p·(1 − lr·wd)).
            elif wd != 0.0:
                p.add_(p, alpha=_DECAY_ALPHA[settings["weight_decay_method"]](lr, wd))
            state = self.state[p]
            if "momentum_buffer" in state:
                state["momentum_buffer"].copy_(buf)
            else:
                state["momentum_buffer"] = buf
            rows, cols = settings_lib.matrix_dims(tuple(p.shape), nd_of[id(p)])
            p.add_(o, alpha=-lr * settings_lib.lr_ratio(settings["adjust_lr_fn"], rows, cols))
        self._remote_steps += 1
        return loss

    # -- overlap -------------------------------------------------------------------------------------------

    @property
    def overlap(self) -> bool:
        """Whether this optimizer overlaps its orthogonalization with backward (plain parameters outside
        torch.distributed; `overlap=`)."""
        return self._overlap is not None

    @property
    def overlap_stats(self) -> OverlapStats:
        """Counts of the updates computed and sent during backward (orthoserve.torch.overlap.OverlapStats): `used`
        says how many results steps took from those sends; all zero without overlap."""
        return self._overlap.stats if self._overlap is not None else OverlapStats()

    @contextlib.contextmanager
    def no_overlap(self) -> Iterator[None]:
        """Backward passes inside send nothing early, e.g. all but the last micro-batch of gradient accumulation,
        whose updates the next backward would void (as DDP's no_sync()); results are the same with or without it."""
        if self._overlap is None:
            yield
            return
        with self._overlap.paused():
            yield

    def _group_for(self, p: torch.Tensor) -> Optional[Dict[str, Any]]:
        """The param group that holds p now (None when none does), by a cache rebuilt when param_groups changed."""
        for attempt in range(2):
            where = self._where.get(id(p))
            if where is not None and where[0] < len(self.param_groups):
                params = self.param_groups[where[0]]["params"]
                if where[1] < len(params) and params[where[1]] is p:
                    return self.param_groups[where[0]]
            if attempt == 0:
                self._where = {id(q): (gi, pi) for gi, g in enumerate(self.param_groups)
                               for pi, q in enumerate(g["params"])}
        return None

    @torch.no_grad()
    def _early_update(self, p: torch.Tensor) -> Optional[Made]:
        """p's update computed by its hook during backward, as step() would now (None: leave p to the step)."""
        group = self._group_for(p)
        if group is None or p.grad is None or p.grad.is_sparse or torch.is_complex(p):
            return None
        settings = self._group_settings(group)
        nd = settings_lib.nd_of(p, settings["nd"])
        buf = self.state[p].get("momentum_buffer") if p in self.state else None
        options = self._ns_options(p, settings, nd)
        inputs = inputs_of(p, buf, settings, options)
        new_grad, new_buf, update = momentum_update(p, p.grad, buf, settings)
        return inputs, new_grad, new_buf, update, options

    def _send_early(self, params: List[torch.Tensor], updates: List[torch.Tensor],
                    options: List[Dict[str, Any]]) -> List[torch.Tensor]:
        """One bucket of early updates orthogonalized (a pool thread): one call, the client's retries, no local
        fallback (a failure is the step's to retry, fall back or raise)."""
        by_param = {id(p): o for p, o in zip(params, options)}
        return orthogonalize_updates(params, updates, client=self.client, transport=self.region_transport,
                                     options_of=lambda p: by_param[id(p)],
                                     name_of=lambda i, p: self._names.get(id(p), f"p{i}"),
                                     identity=self._group_identity, step=self._remote_steps, tp_mode=self.tp_mode,
                                     algorithm=self.algorithm, timeout=self.timeout, fallback=False, what="Muon",
                                     group_prefix="muon")

    # -- the orthogonalization -----------------------------------------------------------------------------

    def _ns_options(self, p: torch.Tensor, settings: Dict[str, Any], nd: str) -> Dict[str, Any]:
        """The server's NS options for parameter p under its param group's `settings` (orthoserve.options names),
        with `nd` (settings_lib.nd_of)."""
        opts: Dict[str, Any] = dict(coefficients=settings["coefficient_type"], steps=settings["ns_steps"],
                                    precision=settings["fp32_matmul_prec"], eps=float(settings["eps"]),
                                    scale_mode=settings["scale_mode"],
                                    extra_scale=float(settings["extra_scale_factor"]),
                                    normalization=settings_lib.normalization_of(self.flavor, settings), nd=nd)
        if settings["coefficient_type"] == "custom":
            opts["custom_coefficients"] = settings_lib.triples(settings["ns_coefficients"])
        if self.split_qkv and self.is_qkv_fn(p):
            opts["split_qkv"] = self.qkv_split_shapes
        return opts

    def _options_for(self, p: torch.Tensor) -> Dict[str, Any]:
        """The server's NS options for parameter p: its param group's settings (orthoserve.options names), and its
        nd (the parameter's `orthoserve_nd`, else its group's)."""
        settings = self._group_of.get(id(p))
        if settings is None:
            group = next((g for g in self.param_groups if any(q is p for q in g["params"])), self.param_groups[0])
            settings = self._group_settings(group)
        return self._ns_options(p, settings, self._nd_of.get(id(p)) or settings_lib.nd_of(p, settings["nd"]))

    def orthogonalize_batch(self, params: List[torch.Tensor], updates: List[torch.Tensor]) -> List[torch.Tensor]:
        """The orthogonalized (and scaled, per scale_mode and extra_scale_factor) update of each parameter (same
        type, dtype, shape as the update).

        Plain tensors (and DTensors that are not sharded) go whole in one stream; sharded DTensors go as one
        group step per shard group, each with this rank's local block; either through shared-memory regions by
        `shm` (region_transport). See orthoserve.torch.updates."""
        return orthogonalize_updates(params, updates, client=self.client, transport=self.region_transport,
                                     options_of=self._options_for, name_of=lambda i, p: self._names.get(id(p), f"p{i}"),
                                     identity=self._group_identity, step=self._remote_steps, tp_mode=self.tp_mode,
                                     algorithm=self.algorithm, timeout=self.timeout, fallback=self.fallback,
                                     what="Muon", group_prefix="muon")
