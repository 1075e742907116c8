#!/usr/bin/env bash
# Runs an S-rank CPU fleet of orthoserve on this machine (loopback), for development and the
# integration tests.
#
#   deploy/local/fleet.sh start [--world S] [--base-port P] [--dir DIR] [--bin DIR] [--token-file F] [--no-fleet-tls]
#                               [-- SERVER FLAGS...]
#   deploy/local/fleet.sh stop  [--dir DIR]
#   deploy/local/fleet.sh status [--dir DIR]
#
# Rank r serves the public API on 127.0.0.1:(P + r), its internal fleet address on
# 127.0.0.1:(P + 50 + r) (rank 0's is the coordinator) and /metrics on 127.0.0.1:(P + 100 + r).
# Logs and pid files go to DIR (default /tmp/orthoserve-fleet). The fleet port speaks mutual TLS,
# as in Kubernetes: `start` makes throw-away certificates in DIR/fleet-tls (fleet_certs.sh here: a
# CA, and rank r's with SAN DNS:orthoserve-rank-r, the default --fleet-tls-member-name) and `stop`
# removes them; --no-fleet-tls runs the fleet port plaintext instead. `start` returns once every
# rank is a member of a formed generation of all S ranks (through `orthoctl info --json` on the
# public port when it is built, else the rank's log), or fails after --wait seconds with the logs'
# tails; with servers that require tokens (--token-file among the server flags) give `start` a
# client token file for that check. `stop` sends SIGTERM (graceful drain), then SIGKILL after 15 s.
set -euo pipefail

cmd=${1:-}
[[ -n "$cmd" ]] && shift || true
world=2
base=47000
dir=/tmp/orthoserve-fleet
bin=""
wait_s=60
token_file=""
fleet_tls=1
extra=()
while (($#)); do
  case "$1" in
    --world) world=$2; shift 2 ;;
    --base-port) base=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --wait) wait_s=$2; shift 2 ;;
    --token-file) token_file=$2; shift 2 ;;
    --no-fleet-tls) fleet_tls=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "fleet.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${bin:-${ORTHOSERVE_BUILD_DIR:-$root/build}/bin}

stop() {
  [[ -d "$dir" ]] || return 0
  local pids=()
  for f in "$dir"/rank*.pid; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); }
    rm -f "$f"
  done
  for _ in $(seq 150); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$dir/fleet-tls"
}

ready() {  # ready RANK: the rank is ready and lists all S members as ready.
  local port=$((base + $1)) n
  if [[ -x "$bin/orthoctl" ]]; then
    local auth=()
    [[ -n "$token_file" ]] && auth=(--token-file "$token_file")
    n=$("$bin/orthoctl" info --json --no-retry --server "127.0.0.1:$port" --timeout 2 "${auth[@]}" 2>/dev/null |
      grep -o '"ready": *true' | wc -l) || return 1
    ((n >= world + 1))
  else
    grep -q "formed here: collective rank [0-9]* of $world " "$dir/rank$1.log" 2>/dev/null
  fi
}

case "$cmd" in
  start)
    [[ -x "$bin/orthoserve" ]] || { echo "fleet.sh: $bin/orthoserve not found; build first (scripts/setup.sh)" >&2; exit 2; }
    stop
    mkdir -p "$dir"
    if ((fleet_tls)); then
      "$root/deploy/local/fleet_certs.sh" fleet "$dir/fleet-tls" "$world" ||
        { echo "fleet.sh: could not make fleet certificates (openssl); --no-fleet-tls runs without" >&2; exit 2; }
    fi
    for ((r = 0; r < world; r++)); do
      tls=()
      ((fleet_tls)) && tls=(--fleet-tls-cert "$dir/fleet-tls/rank$r.crt" --fleet-tls-key "$dir/fleet-tls/rank$r.key"
        --fleet-tls-ca "$dir/fleet-tls/ca.crt")
      "$bin/orthoserve" --rank "$r" --world "$world" \
        --listen "127.0.0.1:$((base + r))" --metrics-address "127.0.0.1:$((base + 100 + r))" \
        --fleet-listen "127.0.0.1:$((base + 50 + r))" --coordinator "127.0.0.1:$((base + 50))" \
        "${tls[@]}" "${extra[@]}" >"$dir/rank$r.log" 2>&1 &
      echo $! >"$dir/rank$r.pid"
    done
    deadline=$((SECONDS + wait_s))
    for ((r = 0; r < world; r++)); do
      until ready "$r"; do
        if ! kill -0 "$(cat "$dir/rank$r.pid")" 2>/dev/null || ((SECONDS > deadline)); then
          echo "fleet.sh: rank $r did not become ready; log tails:" >&2
          for ((q = 0; q < world; q++)); do echo "--- rank $q" >&2; tail -n 20 "$dir/rank$q.log" >&2 || true; done
          stop
          exit 1
        fi
        sleep 0.2
      done
    done
    echo "fleet of $world ranks ready: 127.0.0.1:$base..$((base + world - 1)) (logs in $dir; fleet port" \
      "$( ((fleet_tls)) && echo "mutual TLS, certificates in $dir/fleet-tls" || echo plaintext))"
    ;;
  stop) stop ;;
  status)
    for f in "$dir"/rank*.pid; do
      [[ -f "$f" ]] || continue
      r=${f##*/rank}; r=${r%.pid}
      if kill -0 "$(cat "$f")" 2>/dev/null; then state=running; else state=dead; fi
      echo "rank $r pid $(cat "$f") $state"
    done
    ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
