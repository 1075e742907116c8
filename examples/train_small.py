#!/usr/bin/env python3
"""Trains a small MLP regression with the remote Muon (orthoserve) for its matrices and prints the loss curve.

    .venv/bin/python examples/train_small.py --address 127.0.0.1:50051 --steps 50

The hidden layers' weight matrices use orthoserve.torch.Muon (one remote request per step); the output layer
and the biases use AdamW locally, as Muon is meant for hidden 2-D weights only (the split of
orthoserve.torch.muon_param_groups). The client's default retry policy rides through a server
(or fleet rank) that is restarted: the step is retried until the service is back (up to --retry-deadline
seconds), and with --fallback a step the service cannot serve in that time is computed locally instead.
"""

import argparse
import logging

import torch

import orthoserve
from orthoserve.torch import Muon, muon_param_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50051",
                        help="orthoserve server HOST:PORT (a comma-separated list: fail over in this order)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--precision", default="medium", choices=["highest", "high", "medium"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retry-deadline", type=float, default=120.0,
                        help="seconds a step keeps retrying an unavailable service")
    parser.add_argument("--fallback", action="store_true",
                        help="compute a step locally when the service stays unavailable past the retry deadline")
    args = parser.parse_args()
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")  # Shows each retry.

    torch.manual_seed(args.seed)
    # A teacher network gives the targets, so the loss can fall well below its start.
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    x = torch.randn(512, 16)
    with torch.no_grad():
        y = teacher(x)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 8))
    # Muon for the hidden weights; AdamW for the output head (the last Linear) and the biases.
    muon_groups, adamw_groups = muon_param_groups(model)

    retry = orthoserve.RetryPolicy(deadline=args.retry_deadline)
    with orthoserve.Client(args.address.split(","), timeout=120, retry=retry) as client:
        muon = Muon(muon_groups, client=client, lr=args.lr, momentum=0.95, nesterov=True, weight_decay=0.0,
                    fp32_matmul_prec=args.precision, scale_mode="shape_scaling", extra_scale_factor=1.0,
                    fallback=args.fallback)
        adam = torch.optim.AdamW(adamw_groups, lr=3e-3, weight_decay=0.0)
        for step in range(args.steps):
            muon.zero_grad()
            adam.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            muon.step()
            adam.step()
            print(f"step {step:4d} loss {loss.item():.6f}", flush=True)
        print(f"retries {client.retries}", flush=True)


if __name__ == "__main__":
    main()
