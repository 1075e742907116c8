#!/usr/bin/env bash
# deploy/local/fleet.sh --etcd 3: a 3-member etcd and 3 ranks on loopback with an elected
# coordinator. Checks that every rank is ready under a coordinator with a term, that killing the
# coordinator's process (SIGKILL, by its pid file) gets another rank elected with a higher term,
# that `status` lists the etcd members as healthy, and that `stop` ends every process the script
# started (ranks and etcd, by pid) and removes etcd's data. Run by CTest (labels integration,
# etcd); needs build/bin/orthoserve and orthoctl, /usr/bin/etcd (Debian's etcd-server), openssl
# and python3 (scripts/setup.sh installs them). Bounded: about 30 s, 150 s at most.
#
#   tests/integration/fleet/fleet_etcd_script_test.sh   # ORTHOSERVE_BUILD_DIR (default build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build}
fleet=$root/deploy/local/fleet.sh
orthoctl=$build/bin/orthoctl
work=$(mktemp -d /tmp/orthoserve-fleet-etcd-test.XXXXXX)
dir=$work/fleet
cleanup() {
  "$fleet" stop --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/*.log; do
    [[ -f $f ]] && { echo "--- ${f##*/} (tail)" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}
[[ -x $orthoctl ]] || fail "$orthoctl not built"
[[ -x ${ORTHOSERVE_ETCD_BINARY:-/usr/bin/etcd} ]] || fail "etcd not installed (Debian's etcd-server; scripts/setup.sh)"

# info PORT: the rank's GetServerInfo as one line "COORDINATOR_RANK TERM MEMBERSHIP READY_MEMBERS SELF_READY".
info() {
  "$orthoctl" info --json --no-retry --timeout 2 --server "127.0.0.1:$1" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
c = d.get("coordinator", {})
print(c.get("rank", -1), int(c.get("term", 0)), c.get("membership", ""),
      sum(1 for m in d.get("members", []) if m.get("ready")), int(bool(d.get("ready"))))'
}

# A base port below the kernel's ephemeral range (no client socket holds one there), another one on
# each try: a port another process listens on fails `start`, which then stops what it started.
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
started=0
for attempt in 1 2 3; do
  base=$((10000 + 200 * (RANDOM % ((low - 10400) / 200))))
  echo "attempt ${attempt}: base port ${base}"
  if "$fleet" start --world 3 --etcd 3 --base-port "$base" --dir "$dir" --wait 60; then
    started=1
    break
  fi
done
((started)) || fail "fleet.sh start --world 3 --etcd 3 failed three times"

read -r coord term membership ready_members self_ready <<<"$(info "$base")" || fail "no GetServerInfo from rank 0"
echo "rank 0 sees: coordinator rank ${coord}, term ${term}, membership ${membership}, ${ready_members} ready members"
[[ $membership == etcd ]] || fail "membership is '${membership}', want etcd"
((term > 0 && coord >= 0 && coord < 3 && ready_members == 3 && self_ready == 1)) ||
  fail "want a coordinator with a term and 3 ready members"

status=$("$fleet" status --dir "$dir")
echo "$status"
[[ $(grep -c '^etcd m[0-2] pid [0-9]* client 127.0.0.1:[0-9]* healthy$' <<<"$status") -eq 3 ]] ||
  fail "status does not list 3 healthy etcd members"

# The coordinator killed: another rank is elected (higher term) and the two left form a fleet.
pids=()
for f in "$dir"/rank*.pid "$dir"/etcd*.pid; do pids+=("$(cat "$f")"); done
victim=$(cat "$dir/rank${coord}.pid")
kill -KILL "$victim"
echo "killed the coordinator, rank ${coord} (pid ${victim})"
other=$(((coord + 1) % 3))
deadline=$((SECONDS + 30))
while :; do
  if line=$(info $((base + other))); then
    read -r c t _ n r <<<"$line"
    if ((c >= 0 && c != coord && t > term && n == 2 && r == 1)); then
      echo "rank ${other} sees: rank ${c} elected, term ${t}, 2 ready members (after $((SECONDS + 30 - deadline)) s)"
      break
    fi
  fi
  ((SECONDS < deadline)) || fail "no other coordinator within 30 s (last: ${line:-no answer})"
  sleep 0.5
done

"$fleet" stop --dir "$dir"
for pid in "${pids[@]}"; do
  # A zombie (exited, not yet reaped by whoever adopted it) has ended too.
  if kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; then
    fail "pid ${pid} still runs after stop"
  fi
done
[[ ! -e $dir/etcd ]] || fail "stop left etcd's data in $dir/etcd"
compgen -G "$dir/*.pid" >/dev/null && fail "stop left pid files"
echo "PASS"
