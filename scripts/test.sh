#!/usr/bin/env bash
# Builds everything (the tests, the benchmarks, and the CUDA backend and GPU test programs
# wherever a CUDA toolkit is installed, GPU or not: ORTHOSERVE_WITH_CUDA, default AUTO), then runs
# every test: clang's thread-safety analysis of the lock annotations
# (scripts/check_thread_safety.sh), the C++ suites under CTest (GPU tests skip without a device),
# then the Python suite and the deployment checks when their scripts are present. Expects
# ./scripts/setup.sh to have run (it installs the packages and builds the server).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ORTHOSERVE_BUILD_DIR:-build}

cmake -S . -B "$build_dir" -DORTHOSERVE_WITH_CUDA="${ORTHOSERVE_WITH_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "${ORTHOSERVE_JOBS:-$(nproc)}"

scripts/check_thread_safety.sh

ctest --test-dir "$build_dir" --output-on-failure -j "${ORTHOSERVE_TEST_JOBS:-2}"

if [[ -x scripts/test_python.sh ]]; then
  scripts/test_python.sh
fi
if [[ -x scripts/check_deploy.sh ]]; then
  scripts/check_deploy.sh
fi
