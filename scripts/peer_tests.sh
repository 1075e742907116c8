#!/usr/bin/env bash
# Runs NVIDIA Emerging-Optimizers v0.3.0's own tests (unmodified copies, see the peer directory's README) twice:
# against EO itself (the baseline) and with EO's newton_schulz replaced by orthoserve.torch.newton_schulz through
# client/python/tools/eo_plugin.py (a monkeypatch of the two module attributes that hold it, nothing else), against
# a one-rank CPU server started here; then prints the comparison (client/python/tools/peer_compare.py).
#
#   ./scripts/peer_tests.sh [PEER_DIR] [--seed N|none] [--out DIR]
#
# PEER_DIR: default ../shared/peer-tests/emerging-optimizers-v0.3.0 (relative to the repository root).
# --seed: the tests' own absl --seed flag, the same in both runs so that both see the same random inputs
#   (default 0; "none": unseeded, as upstream's default — then a test whose inputs matter may differ by chance).
# --out: where the JUnit XML files and logs go (default: a new temporary directory, printed).
# Every test file runs in its own pytest process (the files define the same absl flags);
# test_distributed_muon_utils_cpu.py runs under `torchrun --standalone --nproc-per-node 4`.
# Exit status: peer_compare.py's — 0 when every test that passes against EO passes through orthoserve, apart from
# tolerance-only failures listed in docs/numerics.md ("Emerging-Optimizers' own tests"); 1 otherwise.
#
# Environment: ORTHOSERVE_VENV (default .venv; needs the torch set: scripts/setup_python.sh --with-torch),
# ORTHOSERVE_BUILD_DIR (default build), OMP_NUM_THREADS (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

peer=""
seed=0
out=""
while (($#)); do
  case "$1" in
    --seed) seed=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "peer_tests: unknown option $1" >&2; exit 2 ;;
    *) peer=$1; shift ;;
  esac
done
peer=${peer:-../shared/peer-tests/emerging-optimizers-v0.3.0}
peer=$(cd "$peer" 2>/dev/null && pwd) || { echo "peer_tests: no peer test directory ${peer}" >&2; exit 2; }
[[ -d "$peer/tests" ]] || { echo "peer_tests: $peer has no tests/ directory" >&2; exit 2; }

venv=${ORTHOSERVE_VENV:-.venv}
python=$root/$venv/bin/python
torchrun=$root/$venv/bin/torchrun
build=${ORTHOSERVE_BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
binary=$build/bin/orthoserve
[[ -x "$python" && -x "$torchrun" ]] ||
  { echo "peer_tests: $venv lacks python/torchrun; run scripts/setup_python.sh --with-torch" >&2; exit 2; }
[[ -x "$binary" ]] || { echo "peer_tests: no server binary $binary; build it first (scripts/setup.sh)" >&2; exit 2; }

out=${out:-$(mktemp -d /tmp/orthoserve-peer-tests.XXXXXX)}
mkdir -p "$out/eo" "$out/orthoserve"
rm -f "$out"/eo/*.xml "$out"/orthoserve/*.xml
echo "peer_tests: $peer; results in $out"

# -- a one-rank CPU server on free loopback ports ------------------------------------------------------------
read -r port fleet_port < <("$python" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
"$binary" --listen "127.0.0.1:$port" --backend cpu --metrics-address "" --fleet-listen "127.0.0.1:$fleet_port" \
  >"$out/server.log" 2>&1 &
server_pid=$!
trap 'kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT
"$python" - "127.0.0.1:$port" "$server_pid" <<'PY'
import os, sys, time
import orthoserve
address, pid = sys.argv[1], int(sys.argv[2])
client = orthoserve.Client(address, retry=False)
deadline = time.monotonic() + 60
while True:
    try:
        if client.info(refresh=True, timeout=1.0).ready:
            break
    except orthoserve.OrthoserveError:
        pass
    if time.monotonic() > deadline or not os.path.exists(f"/proc/{pid}"):
        sys.exit(f"peer_tests: the server at {address} did not become ready (see its log)")
    time.sleep(0.1)
PY
echo "peer_tests: server 127.0.0.1:$port (pid $server_pid)"

export PYTHONPATH=$root/client/python/tools${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export ORTHOSERVE_ADDRESS=127.0.0.1:$port
export PEER_ABSL_FLAGS=""
[[ $seed != none ]] && PEER_ABSL_FLAGS="--seed=$seed"

run_file() {  # run_file RUN FILE PLUGINS...
  local run=$1 file=$2 stem
  shift 2
  stem=$(basename "$file" .py)
  local args=(-m pytest -p no:cacheprovider -p peer_harness "$@" -q "$file" --junitxml="$out/$run/$stem.xml")
  local status=0
  if [[ $stem == test_distributed_* ]]; then
    (cd "$peer/tests" && timeout 900 "$torchrun" --standalone --nproc-per-node 4 "${args[@]}") \
      >"$out/$run/$stem.log" 2>&1 || status=$?
  else
    (cd "$peer/tests" && timeout 900 "$python" "${args[@]}") >"$out/$run/$stem.log" 2>&1 || status=$?
  fi
  printf '  %-8s %-40s %s\n' "$run" "$stem" \
    "$(grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|error)' "$out/$run/$stem.log" | tail -1 | tr -d '=' ||
       echo "exit status $status, no summary (see $out/$run/$stem.log)")"
}

files=("$peer"/tests/test_*.py)
for run in eo orthoserve; do
  plugins=()
  [[ $run == orthoserve ]] && plugins=(-p eo_plugin)
  for f in "${files[@]}"; do
    run_file "$run" "$f" "${plugins[@]}"
  done
done

echo
status=0
"$python" "$root/client/python/tools/peer_compare.py" "$out/eo" "$out/orthoserve" \
  --numerics "$root/docs/numerics.md" || status=$?
exit $status
