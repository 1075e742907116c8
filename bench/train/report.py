"""bench/train/run.sh's report: bench/results/train.md from train_lm.py's JSON (medians, spreads, losses, the overlap
counts), with the command, the machine and the date."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
from typing import Dict, List

NAMES = {
    "adamw": "AdamW on everything",
    "torch_muon": "torch.optim.Muon on the block weights (its bf16 NS on the trainer's core)",
    "orthoserve_sync": "orthoserve's Muon, synchronous (`overlap=False`)",
    "orthoserve_overlap": "orthoserve's Muon, overlapped (`overlap=True`: buckets of {bucket_mib:g} MiB)",
    "orthoserve_overlap_each": "orthoserve's Muon, overlapped, one matrix per bucket",
    "orthoserve_sync_clip": "orthoserve's Muon, synchronous, with clip_grad_norm_",
    "orthoserve_overlap_clip": "orthoserve's Muon, overlapped, with clip_grad_norm_ (nothing can overlap)",
}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ms(x: float) -> str:
    return f"{x * 1e3:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("result")
    parser.add_argument("out")
    parser.add_argument("--command", required=True)
    parser.add_argument("--load-before", default="")
    parser.add_argument("--load-after", default="")
    args = parser.parse_args()
    data = json.load(open(args.result))
    warmup = data["warmup"]
    variants: Dict[str, dict] = data["variants"]

    def timed(v: str, key: str) -> List[float]:
        return variants[v][key][warmup:]

    base = statistics.median(timed("adamw", "step")) if "adamw" in variants else None
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Training step with Muon: AdamW, torch.optim.Muon, orthoserve synchronous and overlapped",
        "",
        f"Recorded by `{args.command}` on {now}. Machine: {cpu_model()}, 2 cores, shared with other builds and "
        f"tests (load average {args.load_before} before, {args.load_after} after): single figures move by 10% "
        "or more between runs, so compare the variants of one run, which ran step by step in turn (each round in a rotated "
        "order).",
        "",
        f"Model (bench/train/train_lm.py): 4-layer pre-norm transformer LM, d 256, 4 heads, MLP 1024, byte vocabulary, "
        f"context 128, batch 16, on the bytes of /usr/lib/python3.11/*.py; {data['matrix_params']:,} matrix "
        f"parameters in 16 block weights (Muon's, by orthoserve.torch.muon_param_groups; the embeddings, norms and "
        f"head to AdamW). Trainer: one core, one torch thread (torch {data['torch']}); one orthoserve rank "
        "(`--workers 1 --blas-threads 1`, shared-memory regions on) on the other core, on loopback. Muon: "
        "torch.optim.Muon's arguments with lr 0.02 (orthoserve.torch.optim.Muon for orthoserve's); AdamW lr 3e-3. "
        f"Every variant starts from the same weights and sees the same batches. {data['steps']} timed steps each "
        f"after {warmup} warm-up steps.",
        "",
        "Step = forward + backward (+ clip_grad_norm_, in fwd+bwd) + AdamW step + Muon step (seconds: median, and min–max over the timed steps); the "
        "parts are medians in ms; `Muon step` is what `step()` costs the trainer after backward (for the "
        "overlapped variants: the wait for what is still out, plus applying). Trainer CPU: the trainer process's CPU "
        "time per step (median; all its threads, on its one core), so step − CPU is about the time it waited.",
        "",
        "| optimizer | step median s | min–max s | vs AdamW | fwd+bwd ms | AdamW step ms | Muon step ms "
        "| trainer CPU ms | last loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, r in variants.items():
        step = timed(v, "step")
        med = statistics.median(step)
        ratio = f"{med / base:.2f}×" if base else "–"
        muon = ms(statistics.median(timed(v, "muon"))) if v != "adamw" else "–"
        name = NAMES.get(v, v).format(bucket_mib=data["bucket_bytes"] / (1 << 20))
        lines.append(f"| {name} | {med:.3f} | {min(step):.3f}–{max(step):.3f} | {ratio} | "
                     f"{ms(statistics.median(timed(v, 'fwd_bwd')))} | {ms(statistics.median(timed(v, 'adamw')))} | "
                     f"{muon} | {ms(statistics.median(timed(v, 'cpu')))} | {r['loss'][-1]:.4f} |")
    lines += ["", "Losses per step (all steps, warm-up included):", ""]
    for v, r in variants.items():
        lines.append(f"- {v}: " + ", ".join(f"{x:.4f}" for x in r["loss"]))
    overlapped = {v: r for v, r in variants.items() if r.get("overlap_stats") and r["overlap_stats"]["computed"]}
    if overlapped:
        lines += ["", "Overlap counts (orthoserve.torch.Muon.overlap_stats, all steps): updates computed during "
                  "backward, buckets sent, results used by the steps, stale (recomputed by the step), failed:", ""]
        for v, r in overlapped.items():
            s = r["overlap_stats"]
            lines.append(f"- {v}: computed {s['computed']}, buckets {s['buckets']}, used {s['used']}, stale "
                         f"{s['stale']}, failed {s['failed']}; transport of the last call: {r['transport']}")
    for clipped in (False, True):
        ours = [v for v in variants if v.startswith("orthoserve_") and v.endswith("_clip") == clipped]
        if len(ours) > 1:
            same = all(variants[v]["loss"] == variants[ours[0]]["loss"] for v in ours)
            lines += ["", f"The losses of {', '.join(ours)} are "
                      f"{'identical at every step' if same else 'NOT identical'} (an overlapped step is bit for bit "
                      "the synchronous one)."]
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
