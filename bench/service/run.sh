#!/usr/bin/env bash
# Service overhead on loopback, side by side in one run by service_bench against one
# CPU rank (--blas-threads 1 --workers 1):
#  - overhead: a remote stream step vs the in-process CPU engine (one thread) on the same model
#    matrices, alternately; target remote ≤ 1.10× engine;
#  - transport: a steps = 0 stream step vs a raw loopback TCP echo of the same bytes, alternately;
#    target stream throughput ≥ 0.5× raw. Each rep runs the stream step twice: with its results
#    returned in new vectors (MatrixOutput::data), and written into result buffers the caller
#    allocated once (MatrixInput::result). The part runs once per client malloc setting in
#    CLIENT_MALLOC: glibc's default, and "kept" (service_bench --keep-freed-memory, the call
#    docs/operations.md offers trainers);
#  - shm (same-host shared memory, docs/shared_memory.md), against a second rank started with
#    --shm-socket and --workers SHM_WORKERS (default 2: one compute thread per core of a 2-core
#    machine; once the bytes no longer cross a socket, the computation is what is left to spread):
#    (a) the transport part's steps = 0 step with its inputs read from and its results written to a
#    registered memfd region vs the raw loopback TCP echo of the same bytes, alternately (the
#    stream step into the caller's buffers, and the steps = 0 computation alone in process on
#    SHM_WORKERS threads, beside them for reference); target ≥ 3× raw TCP throughput; (b) the
#    overhead part's model matrices through a region vs the in-process engine on SHM_WORKERS
#    threads (service_bench --engine-workers), alternately; target ≤ 1.02×.
# Writes bench/results/service.md (all of it: run PARTS=shm with OUT=elsewhere to keep the file).
#
# The transport part also records CPU time: the server rank's (from /proc, per step), and
# service_bench's own while it runs the raw echo (both ends) and while it is the stream's client.
#
#   bench/service/run.sh
#   REPS=3 LAYERS=2 bench/service/run.sh
#   PARTS=transport ORTHOSERVE_BUILD_DIR=build-transport bench/service/run.sh
#
# Environment: ORTHOSERVE_BUILD_DIR (default build-bench/), PARTS (overhead,transport,shm), MODEL_SHAPES
# (a GPT-2-small layer: 2304x768,768x768,3072x768,768x3072), LAYERS (4), STREAM_SHAPES (4096x1024),
# STREAM_MATRICES (16), CLIENT_MALLOC (default,kept), REPS (5), WARMUP (1), PRECISION (medium),
# SHM_WORKERS (2), PORT (47800; metrics and fleet ports at +100 and +50; the shm rank's at PORT + 10
# and the same offsets), OUT.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build-bench}
parts=${PARTS:-overhead,transport,shm}
model_shapes=${MODEL_SHAPES:-2304x768,768x768,3072x768,768x3072}
layers=${LAYERS:-4}
stream_shapes=${STREAM_SHAPES:-4096x1024}
stream_matrices=${STREAM_MATRICES:-16}
client_malloc=${CLIENT_MALLOC:-default,kept}
reps=${REPS:-5}
warmup=${WARMUP:-1}
precision=${PRECISION:-medium}
port=${PORT:-47800}
shm_port=$((port + 10))
shm_workers=${SHM_WORKERS:-2}
out=${OUT:-$root/bench/results/service.md}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# shellcheck source=bench/build.sh
source "$root/bench/build.sh"
bench_build "$build" service_bench orthoserve orthoctl service_bench

n_shapes=$(echo "$model_shapes" | tr ',' '\n' | grep -c .)
model_matrices=$((n_shapes * layers))
tmp=$(mktemp -d)
cleanup() {
  "$root/deploy/local/fleet.sh" stop --dir "$tmp/fleet" || true
  [ ! -d "$tmp/shm-fleet" ] || "$root/deploy/local/fleet.sh" stop --dir "$tmp/shm-fleet" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
server_flags=(--blas-threads 1 --workers 1 --log-level warning)
"$root/deploy/local/fleet.sh" start --world 1 --base-port "$port" --dir "$tmp/fleet" --bin "$build/bin" -- \
  "${server_flags[@]}"
case ",$parts," in
  *,shm,*)
    "$root/deploy/local/fleet.sh" start --world 1 --base-port "$shm_port" --dir "$tmp/shm-fleet" --bin "$build/bin" \
      -- --blas-threads 1 --workers "$shm_workers" --log-level warning --shm-socket "$tmp/shm.sock"
    ;;
esac

tree="HEAD $(git -C "$root" log -1 --format=%h 2>/dev/null || echo unknown), orthoserve built $(date -u -r "$build/bin/orthoserve" '+%Y-%m-%d %H:%M') UTC"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt")
rank_pid=$(cat "$tmp/fleet/rank0.pid")
# utime + stime of the rank, in seconds.
server_cpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$rank_pid/stat"; }
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u '+%Y-%m-%d %H:%M')
: >"$tmp/runs.jsonl"
server_cpu_s=""
for mode in ${client_malloc//,/ }; do
  case $mode in
    default | kept) ;;
    *) echo "run.sh: CLIENT_MALLOC takes default and/or kept, not '$mode'" >&2; exit 2 ;;
  esac
done
for part in ${parts//,/ }; do
  modes=default
  [ "$part" = transport ] && modes=${client_malloc//,/ }
  for mode in $modes; do
    extra=()
    [ "$mode" = kept ] && extra=(--keep-freed-memory)
    server="127.0.0.1:$port"
    [ "$part" = shm ] && server="127.0.0.1:$shm_port" && extra+=(--engine-workers "$shm_workers")
    cpu_before=$(server_cpu)
    "$build/bench/service/service_bench" --server "$server" --parts "$part" --model-shapes "$model_shapes" \
      --model-matrices "$model_matrices" --stream-shapes "$stream_shapes" --stream-matrices "$stream_matrices" \
      --reps "$reps" --warmup "$warmup" --precision "$precision" "${extra[@]}" | tee -a "$tmp/runs.jsonl"
    if [ "$part" = transport ]; then
      # The rank's CPU time over the part, per step (warm-up included; two stream steps per rep).
      server_cpu_s+="$mode=$(awk -v a="$cpu_before" -v b="$(server_cpu)" -v n=$((2 * (reps + warmup))) \
        'BEGIN {printf "%.3f", (b - a) / n}') "
    fi
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
uptime_line=$(uptime)

mkdir -p "$(dirname "$out")"
python3 - "$tmp/runs.jsonl" "$out" "$start" "$load_before" "$load_after" "$uptime_line" "$model_shapes" \
  "$model_matrices" "$stream_shapes" "$stream_matrices" "$reps" "$warmup" "$precision" "$layers" "$tree" \
  "$build_type" "$server_cpu_s" "$shm_workers" <<'PY'
import json, os, statistics, sys

(runs_path, out, start, load_before, load_after, uptime_line, model_shapes, model_matrices, stream_shapes,
 stream_matrices, reps, warmup, precision, layers, tree, build_type, server_cpu_s, shm_workers) = sys.argv[1:]
over, trans, identical = [], [], None
shm_trans, shm_over, shm_identical = [], [], {}
for line in open(runs_path):
    r = json.loads(line)
    if "shm_identical_results" in r:
        shm_identical[r["part"]] = r["shm_identical_results"]
    elif "identical_results" in r:
        identical = r["identical_results"]
    elif r["part"] == "overhead":
        over.append(r)
    elif r["part"] == "shm_transport":
        shm_trans.append(r)
    elif r["part"] == "shm_overhead":
        shm_over.append(r)
    else:
        trans.append(r)
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
med = lambda xs: statistics.median(xs) if xs else float("nan")
L = ["# Service overhead on loopback: remote step vs in-process engine, streaming vs raw TCP\n"]
L.append(f"Recorded by `bench/service/run.sh` on {start} UTC. Machine: {cpu}, {os.cpu_count()} cores, shared "
         f"with other engineers' builds and tests: load average {load_before} before, {load_after} after "
         f"(`uptime` at the end: `{uptime_line.strip()}`). Tree: {tree} ({build_type or 'unknown'} build).\n")
L.append("Server: one CPU rank, `deploy/local/fleet.sh start --world 1 ... -- --blas-threads 1 --workers 1` on "
         "127.0.0.1. Client and engine: `bench/service/service_bench` (one process), measurements alternated "
         f"side by side; {warmup} untimed pair first, then {reps} timed pairs; medians below.\n")
if over:
    e = med([r["engine_s"] for r in over])
    w = med([r["remote_s"] for r in over])
    s = med([r["remote_server_s"] for r in over])
    f = med([r["first_result_s"] for r in over])
    L.append("## Remote step vs in-process engine\n")
    L.append(f"Work: {model_matrices} matrices, shapes {model_shapes} cycled ({layers} "
             f"layer(s); the default shapes are a GPT-2-small layer's qkv, attention out, MLP up and down), fp32 in and out, quintic, 5 steps, {precision.upper()}, "
             f"{over[0]['gflop']:.1f} GFLOP per step. *engine*: `CpuBackend::Run` (one thread) over all the "
             "matrices in this process; *remote*: one `Client::Step` (stream) of the same matrices, first "
             "byte sent to last result received; *server*: StepSummary.server_seconds. Results are "
             f"{'bitwise identical' if identical else 'NOT identical'} between engine and remote.\n")
    L.append("| | engine s | remote s | remote server s | first result after s |")
    L.append("|---|---|---|---|---|")
    for r in over:
        L.append(f"| rep {r['rep']} | {r['engine_s']:.3f} | {r['remote_s']:.3f} | {r['remote_server_s']:.3f} | "
                 f"{r['first_result_s']:.3f} |")
    L.append(f"| **median** | **{e:.3f}** | **{w:.3f}** | {s:.3f} | {f:.3f} |")
    pairs = ", ".join(f"{r['remote_s'] / r['engine_s']:.2f}" for r in over)
    L.append(f"\nRemote / engine: **{w / e:.2f}×** (ratio of medians; per pair {pairs}). Target: ≤ 1.10×.\n")
def transport(trans, mode, server_cpu):
    b = trans[0]["bytes_each_way"]
    rw = med([r["raw_s"] for r in trans])
    st = med([r["stream_s"] for r in trans])
    f = med([r["first_result_s"] for r in trans])
    rc = med([r["raw_cpu_s"] for r in trans])
    cc = med([r["stream_client_cpu_s"] for r in trans])
    it = med([r["into_s"] for r in trans])
    ic = med([r["into_client_cpu_s"] for r in trans])
    if mode == "kept":
        L.append("### Client keeping freed memory (`service_bench --keep-freed-memory`)\n")
        L.append("The same part again in a new client process that first calls `KeepFreedMemory()` "
                 "(common/malloc_tuning.h), as docs/operations.md offers trainers: freed result vectors and "
                 "gRPC read buffers are reused instead of going back to the kernel.\n")
    else:
        L.append("### Client with glibc's default malloc\n")
    L.append("| | raw s | raw GB/s | raw CPU s | stream s | stream GB/s | stream client CPU s | into s | into GB/s | "
             "into client CPU s | first result after s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in trans:
        L.append(f"| rep {r['rep']} | {r['raw_s']:.3f} | {b / r['raw_s'] / 1e9:.2f} | {r['raw_cpu_s']:.3f} | "
                 f"{r['stream_s']:.3f} | {b / r['stream_s'] / 1e9:.2f} | {r['stream_client_cpu_s']:.3f} | "
                 f"{r['into_s']:.3f} | {b / r['into_s'] / 1e9:.2f} | {r['into_client_cpu_s']:.3f} | "
                 f"{r['first_result_s']:.3f} |")
    L.append(f"| **median** | {rw:.3f} | **{b / rw / 1e9:.2f}** | {rc:.3f} | {st:.3f} | **{b / st / 1e9:.2f}** | "
             f"{cc:.3f} | {it:.3f} | **{b / it / 1e9:.2f}** | {ic:.3f} | {f:.3f} |")
    pairs = ", ".join(f"{r['raw_s'] / r['stream_s']:.2f}" for r in trans)
    into_pairs = ", ".join(f"{r['raw_s'] / r['into_s']:.2f}" for r in trans)
    L.append(f"\nStream / raw throughput: **{rw / st:.2f}×** with results in new vectors (ratio of medians; per pair "
             f"{pairs}); **{rw / it:.2f}×** into the caller's buffers (per pair {into_pairs}). "
             "Target: ≥ 0.5×. The first of the "
             f"{stream_matrices} results arrives after {f / st * 100:.0f}% of the step (median; "
             f"1/{stream_matrices} = {100 / int(stream_matrices):.0f}% if results stream back while later "
             "matrices are still being sent, ~100% if the server waits for the whole batch).\n")
    L.append(f"CPU time per step: raw echo {rc:.3f} s (sender, echo and receiver together); stream: client {cc:.3f} s "
             f"(median; {ic:.3f} s into the caller's buffers) + server {server_cpu} s (the rank's utime + stime over "
             f"the part / its {2 * (int(reps) + int(warmup))} steps).\n")

if trans:
    L.append("## Transport-bound streaming (steps = 0) vs raw loopback TCP\n")
    L.append(f"Work: {stream_matrices} matrices of {stream_shapes} fp32 (cycled), "
             f"{trans[0]['bytes_each_way'] / 2**20:.0f} MiB each way, "
             "NS with steps = 0 (normalize and scale only). *raw*: the same bytes sent over one loopback TCP "
             "connection to an echo thread and received back concurrently (1 MiB send/recv calls); *stream*: one "
             "`Client::Step` (4 MiB DataChunks) returning each result in a new vector (`MatrixOutput::data`); "
             "*into*: the same step writing each result into a buffer the caller allocated once "
             "(`MatrixInput::result`). Throughput = bytes each way / wall time. The server keeps freed memory "
             "(it does so at start-up); the client process is run both ways.\n")
    server_cpu = dict(kv.split("=") for kv in server_cpu_s.split())
    for mode in ("default", "kept"):
        rows = [r for r in trans if r.get("client_malloc", "default") == mode]
        if rows:
            transport(rows, mode, server_cpu.get(mode, "unknown"))
if shm_trans or shm_over:
    L.append("## Same-host shared memory (`PARTS=shm`)\n")
    L.append(f"A second CPU rank, started with `--blas-threads 1 --workers {shm_workers} --shm-socket`, serves this "
             f"part ({shm_workers} compute thread(s): with the bytes off the socket, the computation is what is left to "
             "spread over the cores); service_bench registers memfd regions on it "
             "(`Client::CreateRegion`, docs/shared_memory.md), writes the inputs into them once, and names "
             "slices of them in each stream step for every input and every result "
             "(`MatrixInput::input_region`, `result_region`): the server reads the inputs and writes the results "
             "in place, and only the specs and results' metadata travel on the connection.\n")
if shm_trans:
    b = shm_trans[0]["bytes_each_way"]
    rw = med([r["raw_s"] for r in shm_trans])
    sh = med([r["shm_s"] for r in shm_trans])
    ss = med([r["shm_server_s"] for r in shm_trans])
    sc = med([r["shm_client_cpu_s"] for r in shm_trans])
    it = med([r["into_s"] for r in shm_trans])
    en = med([r["engine_s"] for r in shm_trans])
    ok = shm_identical.get("shm_transport")
    L.append("### (a) Transport-bound (steps = 0): region vs raw loopback TCP\n")
    L.append(f"Work: {stream_matrices} matrices of {stream_shapes} fp32 (cycled), {b / 2**20:.0f} MiB each way, NS "
             "with steps = 0 (normalize and scale only). *raw*: the same bytes through one loopback TCP connection "
             "to an echo thread and back (as in the transport part); *region*: one `Client::Step` whose inputs and "
             "results are slices of one region; *server*: its StepSummary.server_seconds; *into*: the same step "
             "with bytes, results into the caller's buffers (for reference); *engine*: the steps = 0 computation "
             f"alone, in service_bench's process on {shm_workers} thread(s) like the server's workers (`CpuBackend::Run`, "
             "one-thread backends, each taking the next matrix), into "
             "result buffers allocated once, no transport at all. Throughput = bytes each way / wall "
             f"time. Region results are {'bitwise identical' if ok else 'NOT identical'} to the step's with bytes "
             "and the engine's.\n")
    L.append("| | raw s | raw GB/s | region s | region GB/s | region server s | region client CPU s | into s | "
             "into GB/s | engine s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in shm_trans:
        L.append(f"| rep {r['rep']} | {r['raw_s']:.3f} | {b / r['raw_s'] / 1e9:.2f} | {r['shm_s']:.3f} | "
                 f"{b / r['shm_s'] / 1e9:.2f} | {r['shm_server_s']:.3f} | {r['shm_client_cpu_s']:.3f} | "
                 f"{r['into_s']:.3f} | {b / r['into_s'] / 1e9:.2f} | {r['engine_s']:.3f} |")
    L.append(f"| **median** | {rw:.3f} | **{b / rw / 1e9:.2f}** | {sh:.3f} | **{b / sh / 1e9:.2f}** | {ss:.3f} | "
             f"{sc:.3f} | {it:.3f} | **{b / it / 1e9:.2f}** | {en:.3f} |")
    pairs = ", ".join(f"{r['raw_s'] / r['shm_s']:.2f}" for r in shm_trans)
    L.append(f"\nRegion / raw throughput: **{rw / sh:.2f}×** (ratio of medians; per pair {pairs}). Target: ≥ 3×. "
             f"Of the region step's {sh:.3f} s the server computed for {ss:.3f} s (median); stream into the "
             f"caller's buffers / raw: {rw / it:.2f}×. The computation alone takes {en:.3f} s (engine; the region "
             f"step takes {sh / en:.2f}× that), so with no transport cost at all a region step on this server could "
             f"reach {rw / en:.2f}× raw TCP.\n")
if shm_over:
    e = med([r["engine_s"] for r in shm_over])
    w = med([r["shm_s"] for r in shm_over])
    s = med([r["shm_server_s"] for r in shm_over])
    ok = shm_identical.get("shm_overhead")
    L.append("### (b) Model step through a region vs in-process engine\n")
    L.append(f"Work: the overhead part's {model_matrices} matrices ({model_shapes} cycled, {layers} layer(s)), fp32 in "
             f"and out, quintic, 5 steps, {precision.upper()}, {shm_over[0]['gflop']:.1f} GFLOP per step. *engine*: "
             f"`CpuBackend::Run` in this process on {shm_workers} thread(s) like the server's workers (one-thread "
             "backends, each taking the next matrix), into result buffers allocated once (as the region's "
             "are); *region*: one `Client::Step` whose inputs and results are slices of one region. Results are "
             f"{'bitwise identical' if ok else 'NOT identical'} between engine and region.\n")
    L.append("| | engine s | region s | region server s | first result after s |")
    L.append("|---|---|---|---|---|")
    for r in shm_over:
        L.append(f"| rep {r['rep']} | {r['engine_s']:.3f} | {r['shm_s']:.3f} | {r['shm_server_s']:.3f} | "
                 f"{r['first_result_s']:.3f} |")
    L.append(f"| **median** | **{e:.3f}** | **{w:.3f}** | {s:.3f} | {med([r['first_result_s'] for r in shm_over]):.3f} |")
    pairs = ", ".join(f"{r['shm_s'] / r['engine_s']:.2f}" for r in shm_over)
    L.append(f"\nRegion / engine: **{w / e:.2f}×** (ratio of medians; per pair {pairs}). Target: ≤ 1.02×.\n")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
