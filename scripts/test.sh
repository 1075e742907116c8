#!/usr/bin/env bash
# Runs every test: clang's thread-safety analysis of the lock annotations
# (scripts/check_thread_safety.sh), the C++ suites under CTest (GPU tests skip without a device),
# then the Python suite and the deployment checks when their scripts are present. Expects
# ./scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ORTHOSERVE_BUILD_DIR:-build}

scripts/check_thread_safety.sh

ctest --test-dir "$build_dir" --output-on-failure -j "${ORTHOSERVE_TEST_JOBS:-2}"

if [[ -x scripts/test_python.sh ]]; then
  scripts/test_python.sh
fi
if [[ -x scripts/check_deploy.sh ]]; then
  scripts/check_deploy.sh
fi
