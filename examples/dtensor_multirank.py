#!/usr/bin/env python3
"""A multi-rank DTensor job with the remote Muon: W torch.distributed ranks (gloo, processes on 127.0.0.1) hold
an MLP's weights as DTensors — Shard(0) row blocks, and one Shard(1) tensor-parallel layout — and each rank sends
only its local shard; the fleet assembles, orthogonalizes and returns each rank's blocks.

    # a fleet (S ranks) or one server, then:
    .venv/bin/python examples/dtensor_multirank.py --address 127.0.0.1:50051 --ranks 4 --steps 20

Trainer rank r streams to fleet rank floor(r * S / W); rank 0 prints the loss curve.
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import orthoserve
    from orthoserve.torch import Muon

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(args.seed)  # the same full weights and data on every rank
    shapes = [(64, 16), (64, 64), (8, 64)]
    full = [torch.randn(s) / s[1] ** 0.5 for s in shapes]
    layouts = [[Shard(0)], [Shard(1)], [Shard(0)]]
    weights = [torch.nn.Parameter(distribute_tensor(w, mesh, p)) for w, p in zip(full, layouts)]
    weights[1].tp_mode = "duplicated"  # tensor-parallel layout: gather along the partition dim, NS, keep our chunk
    teacher = [torch.randn(s) / s[1] ** 0.5 for s in shapes]
    x = torch.randn(256, 16)
    with torch.no_grad():
        y = torch.tanh(torch.tanh(x @ teacher[0].T) @ teacher[1].T) @ teacher[2].T

    with orthoserve.Client(args.address, timeout=120) as client:
        # Every rank constructs Muon here: with no ORTHOSERVE_RUN_ID / TORCHELASTIC_RUN_ID the ranks agree on a
        # random run id over the process group now, and the default job is "muon-<run id>", one per run.
        opt = Muon(weights, client=client, lr=args.lr, momentum=0.95, nesterov=True, weight_decay=0.0,
                   scale_mode="shape_scaling")
        for step in range(args.steps):
            opt.zero_grad()
            w = [p.full_tensor() for p in weights]
            loss = torch.nn.functional.mse_loss(torch.tanh(torch.tanh(x @ w[0].T) @ w[1].T) @ w[2].T, y)
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"step {step:4d} loss {loss.item():.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50051", help="an orthoserve fleet rank's HOST:PORT")
    parser.add_argument("--ranks", type=int, default=4, help="trainer ranks W")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(args.ranks, port, args), nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
