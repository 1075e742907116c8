#!/usr/bin/env bash
# Runs the Python suite (tests/python) with the project's .venv against real server processes from
# $ORTHOSERVE_BUILD_DIR/bin (default build/bin). First brings .venv's torch and jax sets up to date
# (scripts/setup_python.sh --with-torch --with-jax: torch, emerging-optimizers, the packaging test's wheelhouse; jax
# and optax; a no-op when they are), which the server's own set-up (scripts/setup.sh) does not install. Expects
# ./scripts/setup.sh to have run (the server binary).
#
#   ./scripts/test_python.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ORTHOSERVE_VENV:-.venv}
scripts/setup_python.sh --with-torch --with-jax
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
