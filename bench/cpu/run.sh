#!/usr/bin/env bash
# CPU engine vs numpy + OpenBLAS, side by side in one run: builds cpu_ns_bench (in
# $ORTHOSERVE_BUILD_DIR when set, else build-bench/ under the repository), then for each shape
# runs the engine's benchmark and numpy_ns.py one after the other, all with one BLAS thread,
# and writes bench/results/cpu_ns.md with the medians and the ratios.
#
#   bench/cpu/run.sh                      # all shapes
#   SHAPES=512x512 REPS=3 bench/cpu/run.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build-bench}
shapes=${SHAPES:-512x512,1024x1024,1024x4096,2048x2048}
reps=${REPS:-5}
out=${OUT:-$root/bench/results/cpu_ns.md}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DORTHOSERVE_WITH_CUDA=OFF >/dev/null
fi
bench="$build/bench/cpu/cpu_ns_bench"
if ! cmake --build "$build" --target cpu_ns_bench -- -j2 >"$build/cpu_ns_bench.build.log" 2>&1; then
  # Another folder of the tree may be half-written; an existing binary still measures the engine.
  [ -x "$bench" ] || { cat "$build/cpu_ns_bench.build.log" >&2; exit 1; }
  echo "run.sh: build failed (see $build/cpu_ns_bench.build.log); using the existing $bench" >&2
fi

# numpy interpreters: the project venv (PyPI numpy, its bundled OpenBLAS) and Debian's
# python3-numpy (the system OpenBLAS the engine links), whichever are present.
pythons=()
for py in "$root/.venv/bin/python" /usr/bin/python3; do
  if [ -x "$py" ] && "$py" -c 'import numpy' 2>/dev/null; then pythons+=("$py"); fi
done
if [ ${#pythons[@]} -eq 0 ]; then
  echo "run.sh: no python with numpy found (make the project venv, or install Debian's python3-numpy)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for shape in ${shapes//,/ }; do
  rows=${shape%x*}
  cols=${shape#*x}
  echo "== $shape: engine" >&2
  "$bench" --benchmark_filter="rows:$rows/cols:$cols/" --benchmark_repetitions="$reps" \
    --benchmark_report_aggregates_only=true --benchmark_format=json >"$tmp/engine_$shape.json" 2>/dev/null
  for i in "${!pythons[@]}"; do
    echo "== $shape: numpy (${pythons[$i]})" >&2
    "${pythons[$i]}" "$root/bench/cpu/numpy_ns.py" --reps "$reps" --shapes "$shape" >>"$tmp/numpy_$i.jsonl"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$out" "$load_before" "$load_after" "$reps" "${pythons[@]}" <<'PY'
import glob, json, os, platform, subprocess, sys, datetime

tmp, out, load_before, load_after, reps, pythons = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
engine = {}
context = {}
for path in sorted(glob.glob(os.path.join(tmp, "engine_*.json"))):
    data = json.load(open(path))
    context = data.get("context", context)
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        p = dict(kv.split(":") for kv in b["run_name"].split("/")[1:] if ":" in kv)
        key = (int(p["rows"]), int(p["cols"]), "medium" if p["medium"] == "1" else "highest")
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        engine[key] = (b["real_time"] * scale, b["cpu_time"] * scale)
numpy_runs = []
for i, py in enumerate(pythons):
    rows = [json.loads(l) for l in open(os.path.join(tmp, f"numpy_{i}.jsonl"))]
    numpy_runs.append(({(r["rows"], r["cols"], r["precision"]): r for r in rows}, rows[0] if rows else {}))

cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
L = []
L.append("# CPU engine vs numpy + OpenBLAS: Newton–Schulz throughput\n")
L.append(f"Recorded by `bench/cpu/run.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC. "
         f"Machine: {cpu}, {os.cpu_count()} cores; load average {load_before} before, {load_after} after "
         "(the machine is shared; CPU times are the fairer figure when the load is above the core count).\n")
L.append("Work: quintic coefficients, 5 steps, eps 1e-7, fp32 input and output, one BLAS thread for both sides "
         f"(`OPENBLAS_NUM_THREADS=1`, engine `--threads=1`); medians of {reps} repetitions after a warm-up.\n")
L.append("- **engine**: `cpu_ns_bench` — `CpuBackend::Run` on Debian's OpenBLAS "
         "(one thread): A = X·Xᵀ by ssyrk, B = b·A + c·A·A by ssyrk of the "
         "symmetric A with b·A fused into its output, X = a·X + B·X by sgemm with a·X fused into its output; "
         "MEDIUM adds the bf16 roundings of the contract.")
L.append("- **numpy**: `bench/cpu/numpy_ns.py` — the same loop in fp32 numpy: `A = X @ X.T` (numpy itself calls "
         "ssyrk for this), `B = A @ A; B *= c; B += b*A` (sgemm), `Y = B @ X; Y += a*X` (sgemm); MEDIUM: the same "
         "fp32 matmuls plus bf16 round-to-nearest-even emulation (integer ops on the fp32 bits) of X after "
         "normalization and of A, B and the new X.")
for i, py in enumerate(pythons):
    first = numpy_runs[i][1]
    L.append(f"  - numpy[{i}]: `{py}` — numpy {first.get('numpy', '?')}, BLAS: {first.get('blas', '?')}")
L.append("")
L.append("Ratio = numpy time / engine time (above 1: the engine is faster). Target: ≥ 1.0, goal 1.4.\n")
head = "| shape | precision | engine real ms | engine CPU ms |"
sep = "|---|---|---|---|"
for i in range(len(pythons)):
    head += f" numpy[{i}] real ms | numpy[{i}] CPU ms | ratio[{i}] (CPU) | ratio[{i}] (real) |"
    sep += "---|---|---|---|"
L.append(head)
L.append(sep)
for key in sorted(engine, key=lambda k: (k[2], k[0] * k[1], k[0])):
    real, cputime = engine[key]
    row = f"| {key[0]}×{key[1]} | {key[2].upper()} | {real:.1f} | {cputime:.1f} |"
    for runs, _ in numpy_runs:
        r = runs.get(key)
        if r is None:
            row += " – | – | – | – |"
        else:
            row += f" {r['real_ms']:.1f} | {r['cpu_ms']:.1f} | {r['cpu_ms'] / cputime:.2f}× | {r['real_ms'] / real:.2f}× |"
    L.append(row)
L.append("")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
