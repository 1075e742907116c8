#!/usr/bin/env bash
# Runs optax's own muon tests (optax/contrib/_muon_test.py of the pinned optax, unmodified) twice: against optax
# itself (the baseline) and with optax's muon, scale_by_muon and orthogonalize_via_newton_schulz replaced by
# orthoserve.optax's through client/python/tools/optax_plugin.py (a swap of those module attributes, nothing else),
# against a one-rank CPU server started here; then prints both runs' counts, the tests that pass on the baseline
# but not through orthoserve, and how many requests and matrices the server computed during each run (read from its
# /metrics: none during the baseline, every NS of the swapped run).
#
#   ./scripts/peer_tests_optax.sh [--download] [--out DIR]
#
# The test file: by default the installed optax's own (.venv's jax set: the wheel of the version pinned in
# client/python/requirements-jax.txt, checked here); --download takes it instead from that version's wheel
# downloaded from PyPI with pip into the output directory. Nothing of optax's is kept in the repository.
# --out: where the test file, JUnit XML files and logs go (default: a new temporary directory, printed).
# Exit status: 0 when every test that passes against optax passes through orthoserve; 1 otherwise; 2 on set-up errors.
#
# Environment: ORTHOSERVE_VENV (default .venv; needs the jax set: scripts/setup_python.sh --with-jax),
# ORTHOSERVE_BUILD_DIR (default build), OMP_NUM_THREADS (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

download=0
out=""
while (($#)); do
  case "$1" in
    --download) download=1; shift ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "peer_tests_optax: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

venv=${ORTHOSERVE_VENV:-.venv}
python=$root/$venv/bin/python
build=${ORTHOSERVE_BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
binary=$build/bin/orthoserve
[[ -x "$python" ]] || { echo "peer_tests_optax: no $venv; run scripts/setup_python.sh --with-jax" >&2; exit 2; }
[[ -x "$binary" ]] || { echo "peer_tests_optax: no server binary $binary; build it first (scripts/setup.sh)" >&2; exit 2; }
pin=$(sed -n 's/^optax==\([^ #]*\).*/\1/p' client/python/requirements-jax.txt)
installed=$("$python" -c 'import optax; print(optax.__version__)' 2>/dev/null) ||
  { echo "peer_tests_optax: optax is not installed in $venv; run scripts/setup_python.sh --with-jax" >&2; exit 2; }
[[ $installed == "$pin" ]] ||
  { echo "peer_tests_optax: $venv has optax $installed, the pin is $pin; run scripts/setup_python.sh --with-jax" >&2
    exit 2; }

out=${out:-$(mktemp -d /tmp/orthoserve-peer-optax.XXXXXX)}
mkdir -p "$out/optax" "$out/orthoserve" "$out/tests"
rm -f "$out"/optax/*.xml "$out"/orthoserve/*.xml
test_file=$out/tests/_muon_test.py
if ((download)); then
  "$python" -m pip --disable-pip-version-check download -q --no-deps --only-binary=:all: "optax==$pin" -d "$out/wheel"
  "$python" - "$out/wheel" "$test_file" <<'PY'
import pathlib, sys, zipfile
[wheel] = pathlib.Path(sys.argv[1]).glob("optax-*.whl")
pathlib.Path(sys.argv[2]).write_bytes(zipfile.ZipFile(wheel).read("optax/contrib/_muon_test.py"))
print(f"peer_tests_optax: the tests of {wheel.name} (downloaded)")
PY
else
  "$python" - "$test_file" <<'PY'
import importlib.util, pathlib, shutil, sys
source = pathlib.Path(importlib.util.find_spec("optax.contrib").origin).parent / "_muon_test.py"
shutil.copyfile(source, sys.argv[1])
print(f"peer_tests_optax: the tests of the installed optax ({source})")
PY
fi
echo "peer_tests_optax: optax $pin, $(sha256sum "$test_file" | cut -c1-16) $(basename "$test_file"); results in $out"

# -- a one-rank CPU server on free loopback ports, with metrics -----------------------------------------------
read -r port fleet_port metrics_port < <("$python" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
"$binary" --listen "127.0.0.1:$port" --backend cpu --metrics-address "127.0.0.1:$metrics_port" \
  --fleet-listen "127.0.0.1:$fleet_port" >"$out/server.log" 2>&1 &
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
        sys.exit(f"peer_tests_optax: the server at {address} did not become ready (see its log)")
    time.sleep(0.1)
PY
echo "peer_tests_optax: server 127.0.0.1:$port (pid $server_pid)"

served() {  # served: "REQUESTS MATRICES" answered OK by the server so far
  "$python" - "http://127.0.0.1:$metrics_port/metrics" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
def total(metric):
    return int(sum(float(v) for v in re.findall(rf'^{metric}{{[^}}]*code="OK"[^}}]*}} (\S+)$', text, re.M)))
print(total("orthoserve_requests_total"), total("orthoserve_matrices_total"))
PY
}

export PYTHONPATH=$root/client/python/tools${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export ORTHOSERVE_ADDRESS=127.0.0.1:$port
declare -A calls
for run in optax orthoserve; do
  plugins=()
  [[ $run == orthoserve ]] && plugins=(-p optax_plugin)
  read -r requests_before matrices_before < <(served)
  status=0
  (cd "$out/tests" && timeout 1800 "$python" -m pytest -p no:cacheprovider "${plugins[@]}" -q _muon_test.py \
    --junitxml="$out/$run/_muon_test.xml") >"$out/$run/_muon_test.log" 2>&1 || status=$?
  read -r requests_after matrices_after < <(served)
  calls[$run]="$((requests_after - requests_before)) requests, $((matrices_after - matrices_before)) matrices"
  printf '  %-10s %s; the server answered %s\n' "$run" \
    "$(grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|error)' "$out/$run/_muon_test.log" | tail -1 | tr -d '=' ||
       echo "exit status $status, no summary (see $out/$run/_muon_test.log)")" "${calls[$run]}"
done

echo
"$python" - "$out/optax" "$out/orthoserve" <<'PY'
import collections, pathlib, sys
from peer_compare import PASSED, read_run, measured  # client/python/tools: the JUnit reading of scripts/peer_tests.sh
base, ours = read_run(pathlib.Path(sys.argv[1])), read_run(pathlib.Path(sys.argv[2]))
for name, run in (("optax", base), ("orthoserve", ours)):
    c = collections.Counter(o for o, _ in run.values())
    print(f"{name:>10}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped (of {len(run)} tests)")
lost = [(t, ours.get(t, ("missing", ""))) for t, (o, _) in sorted(base.items())
        if o == PASSED and ours.get(t, ("missing", ""))[0] != PASSED]
passed = sum(o == PASSED for o, _ in base.values())
print(f"passed against optax: {passed}; of them through orthoserve: {passed - len(lost)}")
for test_id, (outcome, text) in lost:
    print(f"  NOT PASSED through orthoserve ({outcome}): {test_id}: {measured(text) if text else outcome}")
sys.exit(1 if lost else 0)
PY
