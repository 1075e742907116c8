#!/usr/bin/env bash
# HTTP/2 windows and stream throughput: the public port's two window policies side by side, in
# one run, on loopback. Two one-rank CPU servers (--blas-threads 1 --workers 1) differ only in
# --grpc-bdp-probe: `fixed` (false, the default: 64 KiB initial windows, the size of a message
# being read announced as it is read) and `bdp` (true: windows from the connection's measured
# bandwidth-delay product, 4 MiB or more for every new call). service_bench's transport part (a
# steps = 0 stream step of 256 MiB each way against a raw loopback TCP echo of the same bytes)
# runs against each in turn, ROUNDS times, so that load on a shared machine falls on both alike.
# The figure that matters is the ratio to the raw echo measured beside it; medians over every rep.
# Why the default is `fixed`: docs/operations.md ("Memory bound"); unary_flood_test measures the
# memory side.
#
#   bench/service/windows.sh
#   ROUNDS=5 REPS=3 bench/service/windows.sh
#
# Environment: ORTHOSERVE_BUILD_DIR (default build-bench/, configured as bench/service/run.sh
# does), ROUNDS (3), REPS (3 timed reps per round, after WARMUP (1)), STREAM_SHAPES (4096x1024),
# STREAM_MATRICES (16), PORT (48200; the second server at +300; metrics and fleet ports at +100
# and +50 of each), OUT (bench/results/windows.md).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build-bench}
rounds=${ROUNDS:-3}
reps=${REPS:-3}
warmup=${WARMUP:-1}
stream_shapes=${STREAM_SHAPES:-4096x1024}
stream_matrices=${STREAM_MATRICES:-16}
port=${PORT:-48200}
out=${OUT:-$root/bench/results/windows.md}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# shellcheck source=bench/build.sh
source "$root/bench/build.sh"
bench_build "$build" windows orthoserve orthoctl service_bench

tmp=$(mktemp -d)
policies=(fixed bdp)
declare -A policy_port=([fixed]=$port [bdp]=$((port + 300)))
declare -A policy_flag=([fixed]=--grpc-bdp-probe=false [bdp]=--grpc-bdp-probe=true)
cleanup() {
  for p in "${policies[@]}"; do "$root/deploy/local/fleet.sh" stop --dir "$tmp/$p" || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
for p in "${policies[@]}"; do
  "$root/deploy/local/fleet.sh" start --world 1 --base-port "${policy_port[$p]}" --dir "$tmp/$p" --bin "$build/bin" -- \
    --blas-threads 1 --workers 1 --log-level warning "${policy_flag[$p]}"
done

tree="HEAD $(git -C "$root" log -1 --format=%h 2>/dev/null || echo unknown), orthoserve built $(date -u -r "$build/bin/orthoserve" '+%Y-%m-%d %H:%M') UTC"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u '+%Y-%m-%d %H:%M')
: >"$tmp/runs.jsonl"
for round in $(seq 1 "$rounds"); do
  for p in "${policies[@]}"; do
    "$build/bench/service/service_bench" --server "127.0.0.1:${policy_port[$p]}" --parts transport \
      --stream-shapes "$stream_shapes" --stream-matrices "$stream_matrices" --reps "$reps" --warmup "$warmup" |
      grep '"part": "transport"' | grep '"rep"' |
      python3 -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line); r["policy"] = sys.argv[1]; r["round"] = int(sys.argv[2]); print(json.dumps(r))' "$p" "$round" |
      tee -a "$tmp/runs.jsonl"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$out")"
python3 - "$tmp/runs.jsonl" "$out" "$start" "$load_before" "$load_after" "$tree" "$build_type" "$stream_shapes" \
  "$stream_matrices" "$rounds" "$reps" "$warmup" <<'PY'
import json, os, statistics, sys

runs_path, out, start, load_before, load_after, tree, build_type, shapes, matrices, rounds, reps, warmup = sys.argv[1:]
runs = [json.loads(line) for line in open(runs_path)]
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
med = lambda xs: statistics.median(xs) if xs else float("nan")
L = ["# HTTP/2 windows: stream throughput with fixed windows (the default) and with BDP probing\n"]
L.append(f"Recorded by `bench/service/windows.sh` on {start} UTC. Machine: {cpu}, {os.cpu_count()} cores, shared with "
         f"other engineers' builds and tests: load average {load_before} before, {load_after} after. Tree: {tree} "
         f"({build_type or 'unknown'} build).\n")
L.append(f"Two one-rank CPU servers, the same but for `--grpc-bdp-probe`; `service_bench --parts transport` against "
         f"each in turn, {rounds} rounds of {reps} timed reps (after {warmup} warm-up). A step is steps = 0 on "
         f"{matrices} matrices of {shapes} fp32 (256 MiB each way with the defaults); `raw` is a loopback TCP echo of "
         f"the same bytes measured beside each step. `stream`: results in new vectors; `into`: results written into "
         f"buffers the caller allocated once. Ratios are raw time / step time (1.0 = raw TCP's throughput).\n")
L.append("| policy | reps | raw s (median) | stream / raw | into / raw | into s (median) |")
L.append("|---|---|---|---|---|---|")
for policy, label in (("fixed", "fixed 64 KiB windows (default)"), ("bdp", "BDP probing (`--grpc-bdp-probe=true`)")):
    rs = [r for r in runs if r["policy"] == policy]
    L.append(f"| {label} | {len(rs)} | {med([r['raw_s'] for r in rs]):.3f} | "
             f"{med([r['raw_s'] / r['stream_s'] for r in rs]):.2f}× | {med([r['raw_s'] / r['into_s'] for r in rs]):.2f}× | "
             f"{med([r['into_s'] for r in rs]):.3f} |")
L.append("\nPer round (medians of its reps):\n")
L.append("| round | fixed: stream / raw | fixed: into / raw | bdp: stream / raw | bdp: into / raw |")
L.append("|---|---|---|---|---|")
for rd in sorted({r["round"] for r in runs}):
    cells = []
    for policy in ("fixed", "bdp"):
        rs = [r for r in runs if r["policy"] == policy and r["round"] == rd]
        cells += [f"{med([r['raw_s'] / r['stream_s'] for r in rs]):.2f}×", f"{med([r['raw_s'] / r['into_s'] for r in rs]):.2f}×"]
    L.append(f"| {rd} | " + " | ".join(cells) + " |")
open(out, "w").write("\n".join(L) + "\n")
print(open(out).read())
PY
