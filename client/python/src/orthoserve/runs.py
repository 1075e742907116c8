"""Run identity of group steps (StepHeader.run_id; docs in client/python/README.md, "Run ids").

The fleet keys every group step (world > 1) by tenant, job, group, step *and run*: the reports of two runs are never
combined, and a retry is answered from kept inputs only for the run (and the blocks) it came from. Every trainer rank
of one run must send the same run id, and no other run may use it. A run id is taken from, in order:

1. an explicit `run_id=` (Client.group, orthoserve.torch.Muon);
2. the environment variable ORTHOSERVE_RUN_ID (set it to the same value on every rank of a run, e.g. the
   scheduler's job id plus the attempt);
3. TORCHELASTIC_RUN_ID, which torchrun sets for every rank of a job (its --rdzv-id, or a fresh uuid for a
   single-node or --standalone launch). torchrun's placeholder "none" (a multi-node launch without --rdzv-id, the
   same in every such launch) is not an id and is skipped;
4. when torch.distributed is initialized: a random id (uuid4().hex) that rank 0 of the default process group draws
   and broadcasts (broadcast_object_list). That is a collective: every rank of the default group must reach it
   together. It happens once per process and default group, at the first call that needs it (agree_run_id; the
   orthoserve.torch.Muon constructor calls it), and is cached;
5. otherwise there is none: resolve_run_id raises ValueError saying how to provide one.

A lone call (world 1) sends no run id. This module never imports torch: it looks for torch.distributed only when
the process has imported it already (a process that has not cannot have initialized it).
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
import weakref
from typing import Any, Optional

__all__ = ["ENV_RUN_ID", "ENV_TORCHELASTIC_RUN_ID", "run_id_from_environment", "agreed_run_id", "agree_run_id",
           "find_run_id", "resolve_run_id", "check_run_id"]

ENV_RUN_ID = "ORTHOSERVE_RUN_ID"
ENV_TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
# torchrun's default --rdzv-id: every multi-node launch without one has it, so it tells no two runs apart.
_TORCHRUN_PLACEHOLDER = "none"

_lock = threading.Lock()
# The agreed id of each default process group, in the process of _agreed_pid (a forked child agrees again).
_agreed: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_agreed_pid = [os.getpid()]


def check_run_id(run_id: Any, what: str = "run_id") -> str:
    """run_id itself when it is a non-empty str; TypeError or ValueError (naming `what`) otherwise."""
    if not isinstance(run_id, str):
        raise TypeError(f"orthoserve: {what} must be a str, got {type(run_id).__name__}")
    if not run_id:
        raise ValueError(f"orthoserve: {what} must not be empty")
    return run_id


def run_id_from_environment() -> Optional[str]:
    """ORTHOSERVE_RUN_ID, else TORCHELASTIC_RUN_ID (unless torchrun's placeholder "none"), stripped; None when
    neither gives one."""
    value = os.environ.get(ENV_RUN_ID, "").strip()
    if value:
        return value
    value = os.environ.get(ENV_TORCHELASTIC_RUN_ID, "").strip()
    if value and value != _TORCHRUN_PLACEHOLDER:
        return value
    return None


def _initialized_dist() -> Any:
    """The torch.distributed module when this process imported it and initialized the default group, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - a torch build without distributed support
        return None


def _default_group(dist: Any) -> Any:
    """The default process group (the cache's key: a group destroyed and made again agrees again)."""
    return dist.group.WORLD


def agreed_run_id() -> Optional[str]:
    """The id agree_run_id agreed on for the current default process group in this process, if it did; no
    collective."""
    dist = _initialized_dist()
    if dist is None:
        return None
    with _lock:
        if _agreed_pid[0] != os.getpid():
            _agreed.clear()
            _agreed_pid[0] = os.getpid()
        return _agreed.get(_default_group(dist))


def agree_run_id() -> Optional[str]:
    """When torch.distributed is initialized: a run id shared by every rank of the default process group, drawn by
    its rank 0 (uuid4().hex) and broadcast, once per process and group (cached); None when torch.distributed is not
    initialized.

    COLLECTIVE on first use: every rank of the default process group must call it at the same point (or reach
    the first call that makes it, such as orthoserve.torch.Muon's constructor), else the ranks that did wait in the
    broadcast."""
    dist = _initialized_dist()
    if dist is None:
        return None
    known = agreed_run_id()
    if known is not None:
        return known
    group = _default_group(dist)
    with _lock:
        known = _agreed.get(group)
        if known is not None:
            return known
        box = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        agreed = box[0]
        if not isinstance(agreed, str) or not agreed:
            raise RuntimeError(f"orthoserve: the run id broadcast by rank 0 of the default process group is {agreed!r}")
        _agreed[group] = agreed
        return agreed


def find_run_id(run_id: Optional[str] = None, *, agree: bool = True) -> Optional[str]:
    """The run id by the order of this module's docstring, or None when there is none. agree=False skips the
    torch.distributed agreement (no collective) but still returns an id agreed before."""
    if run_id is not None:
        return check_run_id(run_id)
    found = run_id_from_environment()
    if found is not None:
        return found
    return agree_run_id() if agree else agreed_run_id()


def resolve_run_id(run_id: Optional[str] = None, *, agree: bool = True, what: str = "a group step") -> str:
    """find_run_id, or ValueError saying how to provide a run id when there is none."""
    found = find_run_id(run_id, agree=agree)
    if found is None:
        raise ValueError(
            f"orthoserve: {what} (world > 1) needs a run id that every trainer rank of this run shares and no other "
            f"run has, and none was found: pass run_id=... (the same on every rank), or set {ENV_RUN_ID} on every "
            f"rank (e.g. your scheduler's job id), or launch with torchrun ({ENV_TORCHELASTIC_RUN_ID}), or initialize "
            "torch.distributed before the first group step (its ranks then agree on a random id; "
            "orthoserve.runs.agree_run_id)")
    return found
