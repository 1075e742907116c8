#!/usr/bin/env bash
# Runs the Python suite (tests/python) with the project's .venv against real server processes from
# $ORTHOSERVE_BUILD_DIR/bin (default build/bin). Expects ./scripts/setup.sh to have run.
#
#   ./scripts/test_python.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ORTHOSERVE_VENV:-.venv}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "test_python: $venv is missing; run ./scripts/setup_python.sh (or ./scripts/setup.sh) first" >&2
  exit 1
fi
export ORTHOSERVE_BUILD_DIR=${ORTHOSERVE_BUILD_DIR:-build}
# Two cores: keep torch's intra-op pools small so ranks and servers do not oversubscribe them.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider -q -rs tests/python "$@" || status=$?
if [[ $status -eq 5 ]]; then
  echo "test_python: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit $status
