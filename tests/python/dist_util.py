"""Runs a function on W torch.distributed (gloo) ranks as processes on 127.0.0.1; a failure on any rank fails
the caller with that rank's traceback."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys

import torch.multiprocessing as mp

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
    """fn(rank, world, *args) on `world` processes; fn must be a module-level function."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    ctx = mp.start_processes(_entry, args=(world, _free_port(), fn, args, list(sys.path)), nprocs=world,
                             join=False, start_method="forkserver")
    while not ctx.join(timeout=timeout):
        pass
