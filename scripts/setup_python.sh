#!/usr/bin/env bash
# Creates the project's Python environment .venv (Debian's python3 -m venv) and installs the orthoserve package
# into it (editable; the package build generates the gRPC stubs from proto/).
#
#   ./scripts/setup_python.sh               # base set: the client, stub generation, pytest (no torch)
#   ./scripts/setup_python.sh --with-torch  # also the torch set: torch, emerging-optimizers, absl-py, and the
#                                           # wheelhouse the packaging test installs from
#   ./scripts/setup_python.sh --with-jax    # also the jax set: jax and jaxlib (CPU), optax 0.2.8, for orthoserve.optax
#                                           # (the two flags combine)
#
# The base set is client/python/requirements.txt (scripts/setup.sh runs this script without --with-torch, so the
# server's run command never pulls torch); the torch set is client/python/requirements-torch.txt
# (scripts/test_python.sh runs this script with --with-torch --with-jax before the tests); the jax set is
# client/python/requirements-jax.txt. All are installed with
# `pip install --no-deps`: the files list every package, so nothing unpinned comes in, and `pip check` must pass.
# Each set has a stamp keyed by the hash of what shapes it, so a second run is a no-op.
#
# Environment: ORTHOSERVE_PYTHON (default /usr/bin/python3), ORTHOSERVE_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

with_torch=0
with_jax=0
for arg in "$@"; do
  case "$arg" in
    --with-torch) with_torch=1 ;;
    --with-jax) with_jax=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "setup_python: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

python=${ORTHOSERVE_PYTHON:-/usr/bin/python3}
venv=${ORTHOSERVE_VENV:-.venv}
base_requirements=client/python/requirements.txt
torch_requirements=client/python/requirements-torch.txt
jax_requirements=client/python/requirements-jax.txt
# Emerging-Optimizers 0.3.0 (the test oracle) declares Requires-Python >= 3.12 but its code runs on
# Debian 12's 3.11 once typing.override exists (tests/python/conftest.py provides it); it is installed
# without its metadata check.
eo_pin="emerging-optimizers==0.3.0"
# Wheels of the base set, for tests/python/test_packaging.py: it installs the package into a fresh venv from
# here alone (pip --no-index), without network access.
wheelhouse="$venv/wheelhouse"

pip=("$venv/bin/python" -m pip --disable-pip-version-check)
python_version=$("$python" --version 2>&1)

check_consistent() {
  # The installed set must be consistent (pip check lists any missing or conflicting requirement).
  local problems
  if ! problems=$("${pip[@]}" check 2>&1); then
    echo "$problems" >&2
    exit 1
  fi
}

start=$(date +%s)
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi

# -- base set: the client, its stubs, pytest --------------------------------------------------------------
base_key=$(cat "$base_requirements" client/python/pyproject.toml client/python/setup.py \
  client/python/MANIFEST.in client/python/tools/gen_proto.py proto/orthoserve/v1/*.proto \
  <(echo "$python_version") | sha256sum | cut -d' ' -f1)
base_stamp="$venv/.orthoserve-stamp"
if [[ -f "$base_stamp" && "$(cat "$base_stamp")" == "$base_key" && -d client/python/src/orthoserve/_proto ]]; then
  echo "setup_python: base set in $venv is up to date"
else
  "${pip[@]}" install -q --no-deps -r "$base_requirements"
  # The editable install's build generates the stubs (client/python/setup.py); grpcio-tools and setuptools come
  # from the base set (no build isolation).
  "${pip[@]}" install -q --no-deps --no-build-isolation -e client/python
  check_consistent
  "$venv/bin/python" -c 'import orthoserve; print(f"setup_python: orthoserve {orthoserve.__version__} (base set)")'
  echo "$base_key" >"$base_stamp"
fi

# -- torch set: orthoserve.torch, the oracle, the tests' wheelhouse ---------------------------------------
if ((with_torch)); then
  torch_key=$(cat "$torch_requirements" "$base_requirements" <(echo "$eo_pin") <(echo "$python_version") |
    sha256sum | cut -d' ' -f1)
  torch_stamp="$venv/.orthoserve-torch-stamp"
  if [[ -f "$torch_stamp" && "$(cat "$torch_stamp")" == "$torch_key" ]]; then
    echo "setup_python: torch set in $venv is up to date"
  else
    "${pip[@]}" install -q --no-deps -r "$torch_requirements"
    "${pip[@]}" install -q --no-deps --ignore-requires-python "$eo_pin"
    check_consistent
    mkdir -p "$wheelhouse"
    "${pip[@]}" download -q --no-deps -r "$base_requirements" -d "$wheelhouse"
    "$venv/bin/python" - <<'PY'
import orthoserve, orthoserve.torch, torch  # noqa: F401
print(f"setup_python: orthoserve {orthoserve.__version__}, torch {torch.__version__} (torch set)")
PY
    echo "$torch_key" >"$torch_stamp"
  fi
fi
# -- jax set: orthoserve.optax --------------------------------------------------------------------------------
if ((with_jax)); then
  jax_key=$(cat "$jax_requirements" "$base_requirements" <(echo "$python_version") | sha256sum | cut -d' ' -f1)
  jax_stamp="$venv/.orthoserve-jax-stamp"
  if [[ -f "$jax_stamp" && "$(cat "$jax_stamp")" == "$jax_key" ]]; then
    echo "setup_python: jax set in $venv is up to date"
  else
    "${pip[@]}" install -q --no-deps -r "$jax_requirements"
    check_consistent
    "$venv/bin/python" - <<'PY'
import jax, optax, orthoserve.optax  # noqa: F401
print(f"setup_python: orthoserve.optax with jax {jax.__version__}, optax {optax.__version__} (jax set)")
PY
    echo "$jax_key" >"$jax_stamp"
  fi
fi
echo "setup_python: done in $(($(date +%s) - start)) s"
