#!/usr/bin/env bash
# Runs a test binary in a network namespace of its own, with its loopback up and
# ORTHOSERVE_TEST_NETNS=1 set, so that the test may change routing rules (partition_test.cc)
# without touching the machine's. Exits 77 (CTest: skipped) where no namespace can be made (not
# root, no unshare, or no ip/setpriv to configure it).
#
#   tests/integration/fleet/run_in_netns.sh build/tests/integration/fleet/partition_fleet_test
set -euo pipefail
for tool in unshare ip setpriv; do
  if ! command -v "$tool" >/dev/null; then
    echo "run_in_netns: no ${tool} here; skipping $1" >&2
    exit 77
  fi
done
if ! unshare -n true 2>/dev/null; then
  echo "run_in_netns: cannot make a network namespace (needs root or CAP_SYS_ADMIN); skipping $1" >&2
  exit 77
fi
exec unshare -n -- sh -c 'ip link set lo up && ORTHOSERVE_TEST_NETNS=1 exec "$@"' sh "$@"
