"""Runs a function on W torch.distributed (gloo) ranks as processes on 127.0.0.1 (run_ranks), or several such jobs
at once, each its own process group with its own environment (run_launches); a failure on any rank fails the caller
with that rank's traceback."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import typing
from typing import Dict, Sequence, Tuple

import torch.multiprocessing as mp

# As conftest does: Emerging-Optimizers 0.3.0 imports typing.override (Python 3.12). The ranks unpickle their function,
# importing its test module (and the oracle, and so EO) before it runs; this module is imported first (_PRELOAD).
if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override

# Ranks are forked from a forkserver that imports torch once (it runs no torch ops, so forking it is safe),
# instead of W fresh interpreters each importing torch: that start-up dominates on a 2-core machine.
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "orthoserve.torch", "dist_util"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, path):
    sys.path[:0] = [p for p in path if p not in sys.path]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout: float = 120) -> None:
    """fn(rank, world, *args) on `world` processes; fn must be a module-level function. `timeout` is how often the
    wait looks at the ranks; bound the whole run with the test's deadline marker (conftest)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    ctx = mp.start_processes(_entry, args=(world, _free_port(), fn, args, list(sys.path)), nprocs=world,
                             join=False, start_method="forkserver")
    _join(ctx, timeout)


def _join(ctx, poll: float) -> None:
    """Waits for every rank of `ctx` (checking every `poll` seconds; a failed rank raises at once). If the wait is
    interrupted (a test's deadline) or a rank failed, the ranks still running — processes this call started — are
    terminated, each by its own handle, before the exception propagates."""
    try:
        while not ctx.join(timeout=poll):
            pass
    except BaseException:
        for process in ctx.processes:
            if process.is_alive():
                process.terminate()
        for process in ctx.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        raise


# Run-id variables a launch's ranks see only when the launch sets them (the test's own environment may hold some).
_RUN_ID_VARIABLES = ("ORTHOSERVE_RUN_ID", "TORCHELASTIC_RUN_ID", "ORTHOSERVE_JOB")


def _launch_entry(index, launches, ports, fn, args, path):
    launch = 0
    while index >= launches[launch][0]:
        index -= launches[launch][0]
        launch += 1
    world, env = launches[launch]
    for name in _RUN_ID_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(env)
    _entry(index, world, ports[launch], fn, (launch, *args), path)


def run_launches(launches: Sequence[Tuple[int, Dict[str, str]]], fn, *args, timeout: float = 120) -> None:
    """Several torch.distributed (gloo) jobs at once, as separate launches would be: launch L is launches[L] =
    (world, environment); its ranks are processes that see `environment` (and none of ORTHOSERVE_RUN_ID,
    TORCHELASTIC_RUN_ID, ORTHOSERVE_JOB unless it sets them), form their own default process group of `world`
    ranks, and run fn(rank, world, L, *args). fn must be a module-level function. Returns when every rank of every
    launch has finished; raises the first failure."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    ports = [_free_port() for _ in launches]
    launches = [(int(world), dict(env)) for world, env in launches]
    ctx = mp.start_processes(_launch_entry, args=(launches, ports, fn, args, list(sys.path)),
                             nprocs=sum(world for world, _ in launches), join=False, start_method="forkserver")
    _join(ctx, timeout)
