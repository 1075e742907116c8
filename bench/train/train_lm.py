"""The training-step benchmark of issue #41 (bench/train/run.sh starts the server and runs this): a 4-layer pre-norm
transformer LM (d 256, 4 heads, MLP 1024, byte vocabulary, context 128, batch 16; 16 block weights, 3.1 M matrix
parameters) on the bytes of CPython's own sources, trained side by side by several optimizers, one step of each in
turn (round robin, each round in a rotated order), so that the machine's load drifts over all of them alike.

Optimizers (--variants, in this order by default):
  adamw           torch.optim.AdamW on every parameter
  torch_muon      torch.optim.Muon on the block weights (orthoserve.torch.muon_param_groups), AdamW on the rest; its
                  bf16 Newton–Schulz runs on the trainer's core
  orthoserve_sync orthoserve.torch.optim.Muon with the same arguments, overlap=False: the step sends every update
                  when it is called and waits for all of them
  orthoserve_overlap  the same with overlap=True (the default): updates leave during backward in buckets of
                  orthoserve.torch.overlap.DEFAULT_BUCKET_BYTES
  orthoserve_overlap_each  overlap with one matrix per bucket (OverlapOptions(bucket_bytes=1))
  orthoserve_sync_clip, orthoserve_overlap_clip  the two with clip_grad_norm_(1.0) between backward and the steps: a
                  loop that cannot overlap (every gradient changes after it was sent), to show what overlap costs
                  there
Every variant starts from the same initial weights and sees the same batches. Each step is timed (forward + backward
(+ clipping), then the AdamW step, then the Muon step), and the trainer process's CPU time over it (all its threads:
the send threads and gRPC's too); the first --warmup steps are left out of the statistics.

Prints one JSON object (the per-step times and losses of each variant, and the overlap counts) on stdout.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

import orthoserve
from orthoserve.torch import OverlapOptions, muon_param_groups
from orthoserve.torch.overlap import DEFAULT_BUCKET_BYTES
from orthoserve.torch.optim import Muon as OrthoserveMuon

VOCAB = 256
D, HEADS, MLP, LAYERS, CONTEXT, BATCH = 256, 4, 1024, 4, 128, 16
VARIANTS = ("adamw", "torch_muon", "orthoserve_sync", "orthoserve_overlap", "orthoserve_overlap_each",
            "orthoserve_sync_clip", "orthoserve_overlap_clip")
MUON_LR, ADAMW_LR = 0.02, 3e-3


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(D)
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.proj = torch.nn.Linear(D, D, bias=False)
        self.norm2 = torch.nn.LayerNorm(D)
        self.fc1 = torch.nn.Linear(D, MLP, bias=False)
        self.fc2 = torch.nn.Linear(MLP, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ByteLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, D)
        self.positions = torch.nn.Embedding(CONTEXT, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)  # The last Linear: AdamW's (muon_param_groups).

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def corpus() -> torch.Tensor:
    data = b"".join(open(path, "rb").read() for path in sorted(glob.glob("/usr/lib/python3.11/*.py")))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batches(data: torch.Tensor, steps: int, seed: int) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - CONTEXT - 1, (BATCH,), generator=g)
        out.append(torch.stack([data[s:s + CONTEXT + 1] for s in starts.tolist()]))
    return out


def optimizers(variant: str, model: ByteLM, client: orthoserve.Client) -> list:
    if variant == "adamw":
        return [torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)]
    muon_groups, adamw_groups = muon_param_groups(model)
    adamw = torch.optim.AdamW(adamw_groups, lr=ADAMW_LR)
    if variant == "torch_muon":
        return [adamw, torch.optim.Muon(muon_groups, lr=MUON_LR)]
    overlap = {"orthoserve_sync": False, "orthoserve_overlap": True,
               "orthoserve_overlap_each": OverlapOptions(bucket_bytes=1)}[variant.removesuffix("_clip")]
    return [adamw, OrthoserveMuon(muon_groups, lr=MUON_LR, client=client, overlap=overlap)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True, help="the orthoserve server, HOST:PORT")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="steps per variant left out of the statistics")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}")
    torch.set_num_threads(1)
    data = corpus()
    total = args.warmup + args.steps
    inputs = batches(data, total, args.seed + 1)
    client = orthoserve.Client(args.address)
    runs: Dict[str, dict] = {}
    for v in variants:
        torch.manual_seed(args.seed)
        model = ByteLM()
        runs[v] = dict(model=model, opts=optimizers(v, model, client), fwd_bwd=[], adamw=[], muon=[], step=[],
                       cpu=[], loss=[])
    matrix_params = sum(p.numel() for g in muon_param_groups(runs[variants[0]]["model"])[0] for _, p in g["params"])
    for step in range(total):
        # Each round in a rotated order, so that no variant always follows the same one (the machine's state after a
        # step, an idle core or a busy one, falls on every variant alike).
        for v in variants[step % len(variants):] + variants[:step % len(variants)]:
            r = runs[v]
            batch = inputs[step]
            c0, t0 = time.process_time(), time.perf_counter()
            for opt in r["opts"]:
                opt.zero_grad(set_to_none=True)
            logits = r["model"](batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            loss.backward()
            if v.endswith("_clip"):
                torch.nn.utils.clip_grad_norm_(r["model"].parameters(), 1.0)
            t1 = time.perf_counter()
            r["opts"][0].step()
            t2 = time.perf_counter()
            if len(r["opts"]) > 1:
                r["opts"][1].step()
            t3, c3 = time.perf_counter(), time.process_time()
            for key, value in (("fwd_bwd", t1 - t0), ("adamw", t2 - t1), ("muon", t3 - t2), ("step", t3 - t0),
                               ("cpu", c3 - c0), ("loss", loss.item())):
                r[key].append(value)
    out = dict(steps=args.steps, warmup=args.warmup, matrix_params=matrix_params, torch=torch.__version__,
               bucket_bytes=DEFAULT_BUCKET_BYTES,
               variants={})
    for v in variants:
        r = runs[v]
        muon = r["opts"][-1]
        stats = getattr(muon, "overlap_stats", None)
        out["variants"][v] = dict({k: r[k] for k in ("fwd_bwd", "adamw", "muon", "step", "cpu", "loss")},
                                  overlap_stats=None if stats is None else stats.__dict__,
                                  transport=getattr(muon, "transport", None))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
