#!/usr/bin/env bash
# Installs everything orthoserve needs on Debian 12 and builds what the server needs into build/:
# the server (build/bin/orthoserve), orthoctl and the Python client (.venv). The tests, the
# benchmarks and the GPU test programs are built by scripts/test.sh (README: the second command),
# which builds everything.
#
#   ./scripts/setup.sh            # apt packages, Python venv (.venv), configure + build the server
#
# Environment: ORTHOSERVE_BUILD_DIR (default build), ORTHOSERVE_WITH_CUDA (AUTO|ON|OFF; default,
# when the build directory is configured the first time: AUTO on a machine with an NVIDIA GPU,
# OFF without one, so that a CPU machine's first build compiles no CUDA; scripts/test.sh turns it
# to AUTO, so CUDA code still compiles and links in every test run), ORTHOSERVE_SKIP_APT=1 to skip
# the package step, ORTHOSERVE_SKIP_VENV=1 to skip the Python environment, ORTHOSERVE_JOBS
# (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${ORTHOSERVE_BUILD_DIR:-build}
jobs=${ORTHOSERVE_JOBS:-$(nproc)}

# System packages (Debian 12 "bookworm"). Keep this list in step with the Dockerfile.
# etcd-server (3.4) is for the tests of server/etcd, which start their own members from
# /usr/bin/etcd on free loopback ports with temporary data directories: they never use etcd's
# default ports 2379/2380, so the system service the package may start (Debian's postinst does
# where services can start) neither serves nor disturbs them. This script leaves that service
# as the package set it up. iproute2 (`ip`) and util-linux (`unshare`, `setpriv`) are for the
# partial-partition test, which makes a network namespace of its own (skipped where it cannot).
# The Go packages (golang-*, protoc-gen-go-grpc) build examples/go, a trainer generated from the
# proto alone, which the test command runs (tests/integration: go_example_test).
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libopenblas-dev libgloo-dev libxxhash-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus yamllint openssl
  etcd-server iproute2 util-linux
  python3 python3-venv python3-dev python3-numpy
  ccache
  golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
  protoc-gen-go-grpc
)

if [[ "${ORTHOSERVE_SKIP_APT:-0}" != 1 ]]; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

if [[ "${ORTHOSERVE_SKIP_VENV:-0}" != 1 && -x scripts/setup_python.sh ]]; then
  scripts/setup_python.sh
fi

# CUDA: as asked, else as the build directory has it, else by whether this machine has a GPU.
cuda=()
if [[ -n "${ORTHOSERVE_WITH_CUDA:-}" ]]; then
  cuda=(-DORTHOSERVE_WITH_CUDA="$ORTHOSERVE_WITH_CUDA")
elif [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    cuda=(-DORTHOSERVE_WITH_CUDA=AUTO)
  else
    cuda=(-DORTHOSERVE_WITH_CUDA=OFF)
  fi
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda[@]}"
cmake --build "$build_dir" -j "$jobs" --target orthoserve orthoctl
