#!/usr/bin/env bash
# Creates the project's Python environment .venv (Debian's python3 -m venv) with the pinned packages of
# client/python/requirements.txt, generates the gRPC stubs and installs the orthoserve package (editable).
#
#   ./scripts/setup_python.sh       # idempotent: does nothing when .venv matches the pins and proto/
#
# Environment: ORTHOSERVE_PYTHON (default /usr/bin/python3), ORTHOSERVE_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${ORTHOSERVE_PYTHON:-/usr/bin/python3}
venv=${ORTHOSERVE_VENV:-.venv}
requirements=client/python/requirements.txt
# Emerging-Optimizers 0.3.0 (the test oracle) declares Requires-Python >= 3.12 but its code runs on
# Debian 12's 3.11 once typing.override exists (tests/python/conftest.py provides it); it is installed
# without its metadata check.
eo_pin="emerging-optimizers==0.3.0"

# The stamp covers everything that shapes the environment: the pins, the package and the proto.
stamp_key=$(cat "$requirements" client/python/pyproject.toml client/python/tools/gen_proto.py \
  proto/orthoserve/v1/*.proto <(echo "$eo_pin") <("$python" --version 2>&1) | sha256sum | cut -d' ' -f1)
stamp="$venv/.orthoserve-stamp"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_key" && -d client/python/src/orthoserve/_proto ]]; then
  echo "setup_python: $venv is up to date"
  exit 0
fi

start=$(date +%s)
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# --no-deps: requirements.txt lists the complete set, so nothing unpinned comes in.
"${pip[@]}" install -q --no-deps -r "$requirements"
"${pip[@]}" install -q --no-deps --ignore-requires-python "$eo_pin"
# The pinned set must be consistent (pip check lists any missing or conflicting requirement).
if ! problems=$("${pip[@]}" check 2>&1); then
  echo "$problems" >&2
  exit 1
fi

"$venv/bin/python" client/python/tools/gen_proto.py
"${pip[@]}" install -q --no-deps --no-build-isolation -e client/python

"$venv/bin/python" - <<'PY'
import orthoserve, orthoserve.torch, torch  # noqa: F401
print(f"setup_python: orthoserve {orthoserve.__version__}, torch {torch.__version__}")
PY
echo "$stamp_key" >"$stamp"
echo "setup_python: done in $(($(date +%s) - start)) s"
