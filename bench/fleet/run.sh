#!/usr/bin/env bash
# Fleet scaling: a 2-rank CPU fleet vs a 1-rank one, one compute thread per rank
# (--blas-threads 1 --workers 1), on the same batch sent as ONE step by a lone client and by a
# W = 2 trainer group, measured alternately (S=1, S=2, S=1, S=2, ...) in one run by fleet_bench;
# writes bench/results/fleet.md with the medians and the ratios.
#
#   bench/fleet/run.sh                                   # 16 × 1024×1024 fp32, MEDIUM, 5 reps
#   SHAPES=3072x1024,1024x1024,4096x1024,1024x4096 REPS=3 MODES=lone bench/fleet/run.sh
#
# Environment: ORTHOSERVE_BUILD_DIR (default build-bench/), SHAPES, MATRICES (16), REPS (5),
# WARMUP (1), PRECISION (medium), MODES (lone,group), BASE_PORT (47600: S=1 on BASE_PORT,
# S=2 on BASE_PORT+10..+11, their metrics and fleet ports at +100 and +50), ISOLATE (1), OUT.
#
# ISOLATE=1 starts every rank in its own session (setsid), hence its own scheduler autogroup when
# the kernel has sched_autogroup_enabled: CFS then shares the cores between autogroups, so on a
# machine that others keep busy all ranks started from one shell would share ONE group's share
# and a 2-rank fleet could not run faster than a 1-rank one, whatever the server does. With a
# group per rank each rank competes as a separate machine's process would. ISOLATE=0 keeps the
# ranks in this shell's session.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build-bench}
shapes=${SHAPES:-1024x1024}
matrices=${MATRICES:-16}
reps=${REPS:-5}
warmup=${WARMUP:-1}
precision=${PRECISION:-medium}
modes=${MODES:-lone,group}
base=${BASE_PORT:-47600}
isolate=${ISOLATE:-1}
out=${OUT:-$root/bench/results/fleet.md}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# shellcheck source=bench/build.sh
source "$root/bench/build.sh"
bench_build "$build" fleet_bench orthoserve orthoctl fleet_bench
build=$(cd "$build" && pwd)  # Absolute: the ISOLATE wrapper and its orthoctl link below refer to it.

tmp=$(mktemp -d)
fleet1="$tmp/fleet1"
fleet2="$tmp/fleet2"
cleanup() {
  "$root/deploy/local/fleet.sh" stop --dir "$fleet1" || true
  "$root/deploy/local/fleet.sh" stop --dir "$fleet2" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
server_flags=(--blas-threads 1 --workers 1 --log-level warning)
bin="$build/bin"
if [ "$isolate" = 1 ]; then
  # fleet.sh runs "$bin/orthoserve ... &" from a script (no job control), so the rank is not a
  # process-group leader and `exec setsid` keeps its pid (the pid file stays right).
  bin="$tmp/bin"
  mkdir -p "$bin"
  printf '#!/bin/sh\nexec setsid %q "$@"\n' "$build/bin/orthoserve" >"$bin/orthoserve"
  chmod +x "$bin/orthoserve"
  ln -s "$build/bin/orthoctl" "$bin/orthoctl"
fi
"$root/deploy/local/fleet.sh" start --world 1 --base-port "$base" --dir "$fleet1" --bin "$bin" -- "${server_flags[@]}"
"$root/deploy/local/fleet.sh" start --world 2 --base-port $((base + 10)) --dir "$fleet2" --bin "$bin" -- \
  "${server_flags[@]}"
autogroups=$(for f in "$fleet1"/rank*.pid "$fleet2"/rank*.pid; do cat "/proc/$(cat "$f")/autogroup" 2>/dev/null |
  cut -d' ' -f1; done | paste -sd' ')
autogroup_on=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo unknown)
pids1=$(cat "$fleet1"/rank*.pid | paste -sd,)
pids2=$(cat "$fleet2"/rank*.pid | paste -sd,)

tree="HEAD $(git -C "$root" log -1 --format=%h 2>/dev/null || echo unknown), orthoserve built $(date -u -r "$build/bin/orthoserve" '+%Y-%m-%d %H:%M') UTC"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u '+%Y-%m-%d %H:%M')
cmd=("$build/bench/fleet/fleet_bench" --a "127.0.0.1:$base" --a-name S=1 --a-pids "$pids1"
  --b "127.0.0.1:$((base + 10))" --b-name S=2 --b-pids "$pids2" --shapes "$shapes" --matrices "$matrices"
  --reps "$reps" --warmup "$warmup" --precision "$precision" --modes "$modes" --world 2)
"${cmd[@]}" | tee "$tmp/runs.jsonl"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
uptime_line=$(uptime)

mkdir -p "$(dirname "$out")"
python3 - "$tmp/runs.jsonl" "$out" "$start" "$load_before" "$load_after" "$uptime_line" "$shapes" "$matrices" \
  "$reps" "$warmup" "$precision" "$isolate" "$autogroup_on" "$autogroups" "$tree" <<'PY'
import json, os, statistics, sys

(runs_path, out, start, load_before, load_after, uptime_line, shapes, matrices, reps, warmup, precision, isolate,
 autogroup_on, autogroups, tree) = sys.argv[1:]
runs, identical = [], {}
for line in open(runs_path):
    r = json.loads(line)
    if "identical_results" in r:
        identical[r["mode"]] = r["identical_results"]
    else:
        runs.append(r)
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
med = lambda xs: statistics.median(xs) if xs else float("nan")
ratio = lambda x, y: f"{x / y:.2f}×" if y > 0 else "–"  # CPU times under one 10 ms tick read as 0.
L = ["# Fleet scaling: 2 CPU ranks vs 1, one compute thread each\n"]
L.append(f"Recorded by `bench/fleet/run.sh` on {start} UTC. Machine: {cpu}, {os.cpu_count()} cores, shared with "
         f"other engineers' builds and tests: load average {load_before} before, {load_after} after "
         f"(`uptime` at the end: `{uptime_line.strip()}`). Tree: {tree}.\n")
L.append(f"Batch: {matrices} matrices of shapes {shapes} (cycled), fp32 in and out, quintic, 5 steps, "
         f"{precision.upper()} precision, AUTO algorithm, sent as ONE stream step. Servers: "
         "`deploy/local/fleet.sh start --world S ... -- --blas-threads 1 --workers 1` (loopback). "
         "`bench/fleet/fleet_bench` alternates the fleets (S=1, S=2, S=1, S=2, ...); "
         f"{warmup} untimed step per fleet and mode first, then {reps} timed ones; medians below. "
         f"ISOLATE={isolate}: " + ("every rank in its own session, hence its own scheduler autogroup"
                                   if isolate == "1" else "all ranks in the script's session")
         + f" (kernel.sched_autogroup_enabled = {autogroup_on}; the ranks' autogroups: {autogroups}).\n")
L.append("- **lone**: one client (header world 1) streams the whole batch to fleet rank 0; on S = 2 rank 0 "
         "computes each matrix itself or forwards it to rank 1 (Peer service) as soon as its bytes are in, "
         "balancing the estimated cost, and streams each result back as it is done.")
L.append("- **group**: a W = 2 trainer group, each trainer rank sending its half (rows) of every matrix from its "
         "own thread; trainer rank r streams to fleet rank ⌊r·S/W⌋ (both to rank 0 on S = 1).")
L.append("- *wall*: client-side time of the step (first byte sent to last result received); *server*: "
         "StepSummary.server_seconds (slowest trainer rank); *CPU*: utime + stime of each server process "
         "during the step (from /proc, 10 ms ticks). *CPU-bound estimate* = S=1 CPU / busiest S=2 rank's CPU: "
         "the speedup an otherwise idle 2-core machine would show if compute dominates (it ignores the "
         "transfer phases that are serial).\n")
L.append("Target: S = 2 at least 1.6× faster than S = 1 (ratio = S=1 wall / S=2 wall).\n")
L.append("| mode | fleet | wall s (median) | wall s (all reps) | server s (median) | CPU s per rank (median) | "
         "CPU s total (median) |")
L.append("|---|---|---|---|---|---|---|")
summary = {}
for mode in ["lone", "group"]:
    for fleet in ["S=1", "S=2"]:
        rs = [r for r in runs if r["mode"] == mode and r["fleet"] == fleet]
        if not rs:
            continue
        w, s = med([r["wall_s"] for r in rs]), med([r["server_s"] for r in rs])
        per_rank = [med([r["rank_cpu_s"][i] for r in rs]) for i in range(len(rs[0]["rank_cpu_s"]))]
        total = med([sum(r["rank_cpu_s"]) for r in rs])
        busiest = med([max(r["rank_cpu_s"]) for r in rs]) if per_rank else float("nan")
        summary[(mode, fleet)] = (w, s, total, [r["wall_s"] for r in rs], busiest)
        allw = ", ".join(f"{r['wall_s']:.2f}" for r in rs)
        L.append(f"| {mode} | {fleet} | {w:.3f} | {allw} | {s:.3f} | {' / '.join(f'{c:.2f}' for c in per_rank)} | "
                 f"{total:.2f} |")
L.append("")
L.append("| mode | ratio of medians (wall) | per-pair ratios (S=1 rep i / S=2 rep i) | ratio (server) | "
         "CPU-bound estimate | CPU S=2 / S=1 | results S=1 ≡ S=2 (bitwise) |")
L.append("|---|---|---|---|---|---|---|")
for mode in ["lone", "group"]:
    if (mode, "S=1") not in summary or (mode, "S=2") not in summary:
        continue
    a, b = summary[(mode, "S=1")], summary[(mode, "S=2")]
    pairs = ", ".join(ratio(x, y) for x, y in zip(a[3], b[3]))
    L.append(f"| {mode} | **{ratio(a[0], b[0])}** | {pairs} | {ratio(a[1], b[1])} | {ratio(a[2], b[4])} | "
             f"{ratio(b[2], a[2])} | {'yes' if identical.get(mode) else 'NO'} |")
L.append("")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
