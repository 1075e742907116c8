"""Two tenants on one server or a 2-rank fleet: a heavy tenant flooding large matrices and a light tenant with
small steps.

Starts one orthoserve (CPU backend, --workers 2, a token file naming tenants "heavy" and "light") on a free
loopback port — or, with FLEET=2, a 2-rank fleet (deploy/local/fleet.sh, --workers 1 per rank), where each
lone matrix is computed by the rank that received it or forwarded to the other, in that rank's fair compute
queue, the heavy processes spread over both ranks — and runs three phases of DURATION seconds each, side by side in one run,
with `orthoctl bench` processes (the C++ client) as the tenants' trainers:
  light alone   one process sending 256x256 stream steps back to back (latency per step);
  heavy alone   HEAVY_PROCS processes, each sending steps of 2 x 1024x1024 back to back;
  both          the two together.
It writes bench/results/tenants.md with the light tenant's p50/p99 latency, the heavy tenant's throughput,
and the bound non-preemptive fair sharing allows for the light tenant under the flood: its p99 alone plus the
service time of one heavy request (the median heavy step alone divided by the steps in flight per compute
slot: the workers of every rank).

  .venv/bin/python bench/tenants/run.py                  # DURATION=20 HEAVY_PROCS=12
  DURATION=10 SHARES=fifo .venv/bin/python bench/tenants/run.py

Environment: ORTHOSERVE_BUILD_DIR (default build), DURATION (20 s per phase), HEAVY_PROCS (12),
PRECISION (medium), SHARES ("" = equal weights; the server's --tenant-shares), FLEET (1, or 2 for a 2-rank
fleet), EXTRA (more server flags), OUT (bench/results/tenants.md, or tenants_fleet.md with FLEET=2).
Loopback only; every loop is bounded by DURATION.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
DURATION = float(os.environ.get("DURATION", "20"))
HEAVY_PROCS = int(os.environ.get("HEAVY_PROCS", "12"))
PRECISION = os.environ.get("PRECISION", "medium")
SHARES = os.environ.get("SHARES", "")
EXTRA = os.environ.get("EXTRA", "").split()  # More server flags, e.g. --fleet-batch-window=0.
FLEET = int(os.environ.get("FLEET", "1"))
OUT = pathlib.Path(os.environ.get("OUT", REPO / "bench" / "results" /
                                  ("tenants.md" if FLEET == 1 else "tenants_fleet.md")))
BUILD = pathlib.Path(os.environ.get("ORTHOSERVE_BUILD_DIR", "build"))
BUILD = BUILD if BUILD.is_absolute() else REPO / BUILD
# Compute threads per rank (2 cores in all), and the compute slots serving lone matrices: every
# rank's workers (on a fleet, a lone client's matrices spread over the ranks' compute queues).
WORKERS = 2 if FLEET == 1 else 1
SLOTS = WORKERS * FLEET


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def orthoctl(token_file: pathlib.Path, address: str, shape: str, matrices: int, iters: int) -> subprocess.Popen:
    """One orthoctl bench process: lone-client stream steps of `matrices` random `shape` matrices, back to
    back, for DURATION seconds (or `iters` steps)."""
    binary = BUILD / "bin" / "orthoctl"
    return subprocess.Popen([str(binary), "bench", "--server", address, "--token-file", str(token_file), "--shape",
                             shape, "--matrices", str(matrices), "--iters", str(iters), "--warmup", "0",
                             "--duration", str(DURATION), "--precision", PRECISION, "--no-retry"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def parse(output: str) -> dict:
    """orthoctl bench's summary: latency median/p99 (s), steps, matrices/s."""
    m = re.search(r"latency:\s+median ([0-9.]+) ms\s+p99 ([0-9.]+) ms", output)
    steps = re.search(r"(\d+) iters after", output)
    if not m or not steps:
        raise RuntimeError(f"unexpected orthoctl output:\n{output}")
    return {"p50": float(m.group(1)) / 1e3, "p99": float(m.group(2)) / 1e3}


def run_phase(tmp: pathlib.Path, addresses: list, light: bool, heavy: bool) -> dict:
    """The heavy processes spread over `addresses` (the fleet's ranks); the light one on the last."""
    procs = []
    start = time.time()
    if heavy:
        procs += [("heavy", orthoctl(tmp / "heavy.tok", addresses[i % len(addresses)], "1024,1024", 2, 100000))
                  for i in range(HEAVY_PROCS)]
    if light:
        procs.append(("light", orthoctl(tmp / "light.tok", addresses[-1], "256,256", 1, 1000000)))
    out = {"heavy": [], "light": []}
    for kind, p in procs:
        text, _ = p.communicate(timeout=DURATION + 600)
        if p.returncode != 0:
            raise RuntimeError(f"orthoctl ({kind}) failed:\n{text}")
        out[kind].append(parse(text) | {"text": text})
    out["seconds"] = time.time() - start
    return out


def steps(result: dict) -> int:
    """Steps an orthoctl bench process timed (its first line: "N iters after")."""
    return int(re.search(r"(\d+) iters after", result["text"]).group(1))


def wait_port(port: int) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after 30 s")


def run_phases(tmp: pathlib.Path, addresses: list):
    return (run_phase(tmp, addresses, light=True, heavy=False), run_phase(tmp, addresses, light=False, heavy=True),
            run_phase(tmp, addresses, light=True, heavy=True))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        (tmp / "tokens").write_text("tok-heavy heavy\ntok-light light\n")
        (tmp / "heavy.tok").write_text("tok-heavy\n")
        (tmp / "light.tok").write_text("tok-light\n")
        flags = [f"--workers={WORKERS}", "--blas-threads=1", f"--token-file={tmp / 'tokens'}",
                 "--max-inflight-bytes=4294967296", "--max-concurrent-streams=256"]
        if SHARES:
            flags.append(f"--tenant-shares={SHARES}")
        flags += EXTRA
        if FLEET > 1:
            base = free_port()
            fleet = [str(REPO / "deploy" / "local" / "fleet.sh"), "--world", str(FLEET), "--base-port", str(base),
                     "--dir", str(tmp / "fleet"), "--bin", str(BUILD / "bin"), "--token-file", str(tmp / "light.tok")]
            subprocess.run([fleet[0], "start", *fleet[1:], "--", *flags], check=True)
            try:
                alone_light, alone_heavy, both = run_phases(tmp, [f"127.0.0.1:{base + r}" for r in range(FLEET)])
            finally:
                subprocess.run([fleet[0], "stop", "--dir", str(tmp / "fleet")], check=False)
        else:
            port, metrics = free_port(), free_port()
            args = [str(BUILD / "bin" / "orthoserve"), f"--listen=127.0.0.1:{port}",
                    f"--metrics-address=127.0.0.1:{metrics}", *flags]
            with open(tmp / "server.log", "wb") as log:
                server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
                try:
                    wait_port(port)
                    alone_light, alone_heavy, both = run_phases(tmp, [f"127.0.0.1:{port}"])
                finally:
                    server.send_signal(signal.SIGTERM)
                    server.wait(timeout=60)

    light_alone, light_both = alone_light["light"][0], both["light"][0]
    heavy_alone_rate = sum(2 * steps(r) for r in alone_heavy["heavy"]) / alone_heavy["seconds"]
    heavy_both_rate = sum(2 * steps(r) for r in both["heavy"]) / both["seconds"]
    # One heavy request's service time: alone, HEAVY_PROCS steps of 2 matrices are in flight on SLOTS
    # compute slots, so a heavy step's latency is about HEAVY_PROCS / SLOTS service times of one step.
    heavy_step = statistics.median(r["p50"] for r in alone_heavy["heavy"])
    heavy_service = heavy_step * SLOTS / HEAVY_PROCS
    bound = light_alone["p99"] + heavy_service
    where = "one server" if FLEET == 1 else f"a {FLEET}-rank fleet"
    lines = [
        f"# Two tenants on {where}",
        "",
        f"`FLEET={FLEET} bench/tenants/run.py`: {where}, CPU backend, --workers {WORKERS} per rank --blas-threads 1, "
        f"{PRECISION.upper()}, "
        f"lone-client stream steps by `orthoctl bench` processes; heavy tenant = {HEAVY_PROCS} processes of "
        f"2 x 1024x1024 steps; light tenant = one process of 256x256 steps; {DURATION:.0f} s per phase; "
        f"--tenant-shares \"{SHARES}\" {' '.join(EXTRA)}. Loopback, {os.cpu_count()} cores.",
        "",
        "| phase | light p50 (s) | light p99 (s) | light steps | heavy matrices/s |",
        "|---|---|---|---|---|",
        f"| light alone | {light_alone['p50']:.4f} | {light_alone['p99']:.4f} | {steps(light_alone)} | |",
        f"| heavy alone | | | | {heavy_alone_rate:.2f} |",
        f"| both | {light_both['p50']:.4f} | {light_both['p99']:.4f} | {steps(light_both)} | {heavy_both_rate:.2f} |",
        "",
        f"Service time of one heavy step (2 x 1024x1024): {heavy_service:.3f} s (median heavy step alone "
        f"{heavy_step:.3f} s x {SLOTS} compute slots / {HEAVY_PROCS} steps in flight)"
        + ("." if FLEET == 1 else "; on the fleet each lone matrix is computed by the receiving rank or "
           "forwarded to the other (Peer service), in that rank's fair compute queue."),
        f"Non-preemptive fair-sharing bound for the light p99 under the flood: {light_alone['p99']:.4f} + "
        f"{heavy_service:.3f} = {bound:.3f} s; measured {light_both['p99']:.3f} s = "
        f"**{light_both['p99'] / bound:.2f}x the bound** (target <= 2).",
        f"Heavy throughput shared / alone: **{heavy_both_rate / heavy_alone_rate:.2f}** (target >= 0.90).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
