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
request (whole tensors in one stream; DTensor shards as one group step per shard group), or, overlapped with
backward (Muon's overlap=, on by default for plain tensors outside torch.distributed), one request per bucket of
updates sent during backward, plus one at step() for any the step had to compute itself (orthoserve.torch.overlap).

Same host: whole tensors, and this rank's blocks of group steps (sharded DTensors, tp_group), go through shared-memory
regions when the server rank they go to is on this host and takes regions (orthoserve.region_transport: `shm="auto"`
by default, True to require it, False for bytes; $ORTHOSERVE_SHM sets the default, and is the only switch of
newton_schulz). Results are bit for bit the same.

Group steps carry a run id (StepHeader.run_id; orthoserve.runs): Muon's `run_id=`, else $ORTHOSERVE_RUN_ID, else
$TORCHELASTIC_RUN_ID (torchrun), else a random id agreed over the default torch.distributed process group — a
collective that Muon's constructor makes, so construct Muon on every rank of the job, as training scripts do.
newton_schulz(tp_group=...) takes $ORTHOSERVE_RUN_ID / $TORCHELASTIC_RUN_ID or an id agreed before, else the random
key its tp_group agrees on first use (a collective of that group only).

The package, by responsibility (each module says more): defaults (which client; region_transport), functional
(newton_schulz, RemoteNewtonSchulz), tp_groups (newton_schulz with tp_group as a group step), dtensors (DTensor blocks
and shard groups), updates (a step's updates sent whole or as group steps, through the region transport), fallback
(the local computation of fallback=True), param_names (the names of parameters on the wire), muon (the Muon optimizer),
muon_settings (its flavors, defaults and checks), muon_update (its update before the orthogonalization), overlap (its
orthogonalization overlapped with backward), param_groups (muon_param_groups: the Muon/AdamW split) and
not_traced (the calls of the service excluded from torch.compile tracing).
Everything public is imported from here: `from orthoserve.torch import Muon`.
"""

try:
    import torch  # noqa: F401  (every module of the package needs it)
except ImportError as e:  # pragma: no cover - exercised by the client-only install test
    raise ImportError("orthoserve.torch needs PyTorch, which is not installed (the orthoserve client itself does "
                      "not): pip install torch, or the package's extra: pip install 'orthoserve[torch]'") from e

from orthoserve.torch.defaults import (ENV_ADDRESS, ENV_TOKEN, get_default_client, region_transport,
                                       set_default_client)
from orthoserve.torch.dtensors import dtensor_block, dtensor_group, dtensor_shard, is_dtensor
from orthoserve.torch.functional import RemoteNewtonSchulz, newton_schulz
from orthoserve.torch.muon import Muon
from orthoserve.torch.overlap import OverlapOptions, OverlapStats
from orthoserve.torch.param_groups import muon_param_groups

__all__ = ["newton_schulz", "set_default_client", "get_default_client", "region_transport", "RemoteNewtonSchulz",
           "Muon", "muon_param_groups", "OverlapOptions", "OverlapStats",
           "dtensor_block", "dtensor_group", "dtensor_shard", "is_dtensor", "ENV_ADDRESS", "ENV_TOKEN"]
