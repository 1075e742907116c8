"""Two tenants' group steps on a 2-rank fleet: a heavy tenant whose steps carry many large matrices and a light
tenant with small steps, with the fleet's group batches appended whole or divided into parts.

Group steps (W > 1 trainer ranks) run as batches of the whole fleet, one at a time, in the coordinator's fair
order (--fleet-batch-window 1). A batch is the unit the light tenant waits for: with whole steps, one heavy
step of MATRICES x 1024x1024; with parts (--fleet-batch-part-time, default 100ms), about one part. This runs
the same three phases of DURATION seconds for each part time in PART_TIMES, one fleet after the other in one
run (deploy/local/fleet.sh, --workers 1 --blas-threads 1 per rank, a token file naming tenants "heavy" and
"light"):
  light alone   one group (W = 2 trainer threads) sending 1 x 256x256 steps back to back (latency per step);
  heavy alone   HEAVY_GROUPS groups (W = 2 each), each sending steps of MATRICES x 1024x1024 back to back;
  both          the two together.
Each group is one process of this script ("trainer" mode, the Python client, one thread per trainer rank);
its ranks agree on when to stop at a step boundary, so no step is left half sent. It writes
bench/results/tenants_groups.md: per part time, the light tenant's p50/p99, the heavy tenant's matrices/s and
the light p99 against the non-preemptive fair-sharing bound for whole steps (its p99 alone plus one heavy
step's service time: the median heavy step alone over the HEAVY_GROUPS steps in flight, as one batch runs at
a time).

  .venv/bin/python bench/tenants/groups.py                 # DURATION=30 HEAVY_GROUPS=2 MATRICES=8
  DURATION=10 PART_TIMES=100ms,0 .venv/bin/python bench/tenants/groups.py

Environment: ORTHOSERVE_BUILD_DIR (default build), DURATION (30 s per phase), HEAVY_GROUPS (2), MATRICES (8),
PRECISION (medium), PART_TIMES ("100ms,0"), OUT (bench/results/tenants_groups.md). Loopback only; every loop
is bounded by DURATION.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[2]
DURATION = float(os.environ.get("DURATION", "30"))
HEAVY_GROUPS = int(os.environ.get("HEAVY_GROUPS", "2"))
MATRICES = int(os.environ.get("MATRICES", "8"))
PRECISION = os.environ.get("PRECISION", "medium")
PART_TIMES = [p.strip() for p in os.environ.get("PART_TIMES", "100ms,0").split(",") if p.strip()]
OUT = pathlib.Path(os.environ.get("OUT", REPO / "bench" / "results" / "tenants_groups.md"))
BUILD = pathlib.Path(os.environ.get("ORTHOSERVE_BUILD_DIR", "build"))
BUILD = BUILD if BUILD.is_absolute() else REPO / BUILD
WORLD = 2  # Trainer ranks per group.
FLEET = 2  # Fleet ranks.


def trainer(args) -> int:
    """One group: WORLD threads, trainer rank r sending its torch.chunk row block of `matrices` random matrices
    of `shape`, step after step, until `duration` has passed at a step boundary. Prints the step latencies
    (trainer rank 0's, in seconds) as JSON."""
    import numpy as np

    import orthoserve

    rows, cols = (int(d) for d in args.shape.split(","))
    rng = np.random.default_rng(args.seed)
    fulls = [rng.standard_normal((rows, cols), dtype=np.float32) for _ in range(args.matrices)]
    blocks = orthoserve.chunk_blocks((rows, cols), WORLD, 0)
    client = orthoserve.Client(args.addresses.split(","), token=args.token, timeout=600, retry=False)
    # This process's trainer threads are one run; another groups.py process is another run.
    run_id = f"bench-tenants-{uuid.uuid4().hex}"
    barrier = threading.Barrier(WORLD)
    stop = [False]
    latencies, failures = [], []
    start = time.time()

    def rank_main(rank: int) -> None:
        (r0, c0), (n, m) = blocks[rank]
        shards = [orthoserve.Shard(f"w{i}", (rows, cols), (r0, c0), full[r0:r0 + n, c0:c0 + m].copy(),
                                   precision=args.precision) for i, full in enumerate(fulls)]
        group = client.group(args.job, args.group, rank, WORLD, run_id=run_id)
        step = 0
        try:
            while True:
                # Every rank sees the same decision: rank 0 takes it between the two waits.
                barrier.wait(600)
                if rank == 0:
                    stop[0] = time.time() - start > args.duration or bool(failures)
                barrier.wait(600)
                if stop[0]:
                    return
                t = time.time()
                group.step(step, shards)
                if rank == 0:
                    latencies.append(time.time() - t)
                step += 1
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [f for f in failures if "BrokenBarrierError" not in f]
    if real:
        print(json.dumps({"error": real[0]}))
        return 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"latencies": latencies, "seconds": time.time() - start, "cpu_s": usage.ru_utime + usage.ru_stime}))
    return 0


def start_trainer(tmp: pathlib.Path, addresses: str, tenant: str, group: str, shape: str, matrices: int,
                  seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "trainer", "--addresses", addresses, "--token",
                             f"tok-{tenant}", "--job", f"{tenant}-job", "--group", group, "--shape", shape,
                             "--matrices", str(matrices), "--seed", str(seed), "--duration", str(DURATION),
                             "--precision", PRECISION], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def run_phase(tmp: pathlib.Path, addresses: str, light: bool, heavy: bool) -> dict:
    procs = []
    if heavy:
        procs += [("heavy", start_trainer(tmp, addresses, "heavy", f"g{i}", "1024,1024", MATRICES, i))
                  for i in range(HEAVY_GROUPS)]
    if light:
        procs.append(("light", start_trainer(tmp, addresses, "light", "g", "256,256", 1, 100)))
    out = {"heavy": [], "light": []}
    for kind, p in procs:
        text, _ = p.communicate(timeout=DURATION + 900)
        lines = [line for line in text.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"error": text}
        if p.returncode != 0 or "error" in result:
            raise RuntimeError(f"trainer ({kind}) failed:\n{text}")
        out[kind].append(result)
    return out


def p99(values: list) -> float:
    """Nearest rank: the smallest latency that at least 99% of the steps did not exceed."""
    s = sorted(values)
    return s[max(0, -(-99 * len(s) // 100) - 1)]


def run_fleet(tmp: pathlib.Path, part_time: str) -> dict:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from run import free_port  # noqa: E402 - the sibling benchmark's helper

    flags = ["--workers=1", "--blas-threads=1", f"--token-file={tmp / 'tokens'}", "--max-inflight-bytes=4294967296",
             "--max-concurrent-streams=256", "--fleet-batch-window=1", f"--fleet-batch-part-time={part_time}"]
    base = free_port()
    fleet = [str(REPO / "deploy" / "local" / "fleet.sh"), "--world", str(FLEET), "--base-port", str(base), "--dir",
             str(tmp / f"fleet-{part_time}"), "--bin", str(BUILD / "bin"), "--token-file", str(tmp / "light.tok")]
    subprocess.run([fleet[0], "start", *fleet[1:], "--", *flags], check=True)
    addresses = ",".join(f"127.0.0.1:{base + r}" for r in range(FLEET))
    try:
        light_alone = run_phase(tmp, addresses, light=True, heavy=False)
        heavy_alone = run_phase(tmp, addresses, light=False, heavy=True)
        both = run_phase(tmp, addresses, light=True, heavy=True)
    finally:
        subprocess.run([fleet[0], "stop", "--dir", str(tmp / f"fleet-{part_time}")], check=False)

    def heavy_rate(phase: dict) -> float:
        return sum(MATRICES * len(r["latencies"]) for r in phase["heavy"]) / max(r["seconds"] for r in phase["heavy"])

    heavy_step = statistics.median(x for r in heavy_alone["heavy"] for x in r["latencies"])
    return {
        "light_cpu_both": both["light"][0]["cpu_s"],
        "heavy_cpu_alone": sum(r["cpu_s"] for r in heavy_alone["heavy"]),
        "heavy_cpu_both": sum(r["cpu_s"] for r in both["heavy"]),
        "both_seconds": max(r["seconds"] for r in both["heavy"] + both["light"]),
        "light_alone": light_alone["light"][0]["latencies"],
        "light_both": both["light"][0]["latencies"],
        "heavy_alone_rate": heavy_rate(heavy_alone),
        "heavy_both_rate": heavy_rate(both),
        "heavy_step": heavy_step,
    }


def main() -> int:
    results = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        (tmp / "tokens").write_text("tok-heavy heavy\ntok-light light\n")
        (tmp / "light.tok").write_text("tok-light\n")
        for part_time in PART_TIMES:
            results[part_time] = run_fleet(tmp, part_time)
    lines = [
        "# Two tenants' group steps on a 2-rank fleet: whole batches against parts",
        "",
        f"`bench/tenants/groups.py`: a {FLEET}-rank fleet (deploy/local/fleet.sh), CPU backend, --workers 1 "
        f"--blas-threads 1 per rank, {PRECISION.upper()}, --fleet-batch-window 1; group steps of W = {WORLD} trainer "
        f"ranks (threads of one Python client process per group, row blocks, AUTO); heavy tenant = {HEAVY_GROUPS} "
        f"groups of {MATRICES} x 1024x1024 steps; light tenant = one group of 1 x 256x256 steps; {DURATION:.0f} s "
        f"per phase; the part times one after the other in one run. Loopback, {os.cpu_count()} cores.",
        "",
        "| --fleet-batch-part-time | light alone p50 / p99 (s) | light under flood p50 / p99 (s) | light steps "
        "under flood | heavy matrices/s alone / shared | light p99 / whole-step bound |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for part_time, r in results.items():
        alone, both = r["light_alone"], r["light_both"]
        service = r["heavy_step"] / HEAVY_GROUPS
        bound = p99(alone) + service
        lines.append(
            f"| {part_time} | {statistics.median(alone):.4f} / {p99(alone):.4f} | {statistics.median(both):.4f} / "
            f"{p99(both):.4f} | {len(both)} | {r['heavy_alone_rate']:.2f} / {r['heavy_both_rate']:.2f} "
            f"({r['heavy_both_rate'] / r['heavy_alone_rate']:.2f}) | {p99(both) / bound:.2f}x |")
        notes.append(f"- {part_time}: median heavy step alone {r['heavy_step']:.3f} s, one step's service time "
                     f"{service:.3f} s ({HEAVY_GROUPS} in flight, one batch at a time); bound {p99(alone):.4f} + "
                     f"{service:.3f} = {bound:.3f} s. Client processes' CPU (user + system): heavy "
                     f"{r['heavy_cpu_alone']:.1f} s alone, {r['heavy_cpu_both']:.1f} s under flood beside the light "
                     f"tenant's {r['light_cpu_both']:.1f} s, in {r['both_seconds']:.0f} s of 2 cores.")
    lines += ["", *notes, ""]
    text = "\n".join(lines)
    print(text)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "trainer":
        parser = argparse.ArgumentParser()
        parser.add_argument("mode")
        for flag in ("addresses", "token", "job", "group", "shape", "precision"):
            parser.add_argument(f"--{flag}", required=True)
        parser.add_argument("--matrices", type=int, required=True)
        parser.add_argument("--seed", type=int, required=True)
        parser.add_argument("--duration", type=float, required=True)
        sys.exit(trainer(parser.parse_args()))
    sys.exit(main())
