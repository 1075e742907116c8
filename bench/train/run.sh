#!/usr/bin/env bash
# Training-step cost of Muon (issue #41): the 4-layer byte-level transformer LM of bench/train/train_lm.py trained
# on CPython's sources, side by side in one run (round robin, one step of each in turn): AdamW, torch.optim.Muon,
# orthoserve's Muon synchronous (overlap=False) and overlapped (the default buckets, and one matrix per bucket), and
# both with clip_grad_norm_ between backward and step (a loop that cannot overlap: what overlap costs there). The
# trainer is pinned to core TRAINER_CORE with one torch thread; one orthoserve rank (--workers 1 --blas-threads 1,
# and a --shm-socket, so that the client's default shm="auto" uses a shared-memory region) is started here on
# loopback, pinned to SERVER_CORE. Writes bench/results/train.md: per variant the median and the min–max of the
# step over STEPS steps after WARMUP, the median of each part (forward + backward, AdamW step, Muon step), the last
# loss, and the overlap counts.
#
#   bench/train/run.sh
#   STEPS=4 WARMUP=1 VARIANTS=adamw,orthoserve_sync,orthoserve_overlap bench/train/run.sh
#
# Environment: ORTHOSERVE_BUILD_DIR (default build/; only bin/orthoserve is used, built by scripts/setup.sh), PYTHON
# (default .venv/bin/python, with torch: scripts/setup_python.sh --with-torch), STEPS (8), WARMUP (2), VARIANTS (all),
# TRAINER_CORE (0), SERVER_CORE (1), PORT (47900; the fleet port at +50), OUT.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build}
python=${PYTHON:-$root/.venv/bin/python}
steps=${STEPS:-8}
warmup=${WARMUP:-2}
variants=${VARIANTS:-adamw,torch_muon,orthoserve_sync,orthoserve_overlap,orthoserve_overlap_each,orthoserve_sync_clip,orthoserve_overlap_clip}
trainer_core=${TRAINER_CORE:-0}
server_core=${SERVER_CORE:-1}
port=${PORT:-47900}
out=${OUT:-$root/bench/results/train.md}
server="$build/bin/orthoserve"
[ -x "$server" ] || { echo "run.sh: $server is missing: build it (scripts/setup.sh)" >&2; exit 1; }
"$python" -c 'import torch, orthoserve.torch' || { echo "run.sh: $python lacks torch or orthoserve" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

tmp=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

address="127.0.0.1:$port"
taskset -c "$server_core" "$server" --listen "$address" --backend cpu --workers 1 --blas-threads 1 \
  --metrics-address "" --fleet-listen "127.0.0.1:$((port + 50))" --shm-socket "$tmp/shm.sock" >"$tmp/server.log" 2>&1 &
server_pid=$!
ready=0
for _ in $(seq 1 100); do
  if "$python" -c "import orthoserve, sys; sys.exit(0 if orthoserve.Client('$address', retry=False).info(timeout=1).ready else 1)" \
      2>/dev/null; then ready=1; break; fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.2
done
[ "$ready" = 1 ] || { echo "run.sh: the server did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
cmd=(taskset -c "$trainer_core" "$python" "$root/bench/train/train_lm.py" --address "$address" --steps "$steps"
     --warmup "$warmup" --variants "$variants")
echo "== ${cmd[*]}" >&2
"${cmd[@]}" >"$tmp/result.json"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

command="STEPS=$steps WARMUP=$warmup VARIANTS=$variants TRAINER_CORE=$trainer_core SERVER_CORE=$server_core bench/train/run.sh"
mkdir -p "$(dirname "$out")"
"$python" "$root/bench/train/report.py" "$tmp/result.json" "$out" --command "$command" \
  --load-before "$load_before" --load-after "$load_after"
echo "run.sh: wrote $out" >&2
