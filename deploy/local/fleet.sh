#!/usr/bin/env bash
# Runs an S-rank CPU fleet of orthoserve on this machine (loopback), for development and the
# integration tests.
#
#   deploy/local/fleet.sh start [--world S] [--base-port P] [--dir DIR] [--bin DIR] [--token-file F] [--no-fleet-tls]
#                               [--etcd N] [-- SERVER FLAGS...]
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
#
# --etcd N (1 or 3) elects the coordinator instead: `start` first runs an etcd cluster of N members
# (/usr/bin/etcd from Debian's etcd-server, or $ORTHOSERVE_ETCD_BINARY), member i with its client
# URL on 127.0.0.1:(P + 150 + i) and its peer URL on 127.0.0.1:(P + 160 + i), data in
# DIR/etcd/mI.etcd, log DIR/etcdI.log, pid and client port in DIR/etcdI.pid and DIR/etcdI.port;
# waits until every member answers GET /health with "health":"true" (etcd's HTTP endpoint on the
# client port, read with bash's /dev/tcp: no etcdctl or curl needed); then starts the ranks
# with --membership etcd://127.0.0.1:(P + 150),.../orthoserve/local-P and no --coordinator: every
# rank campaigns and the elected one coordinates (`orthoctl info --json`: coordinator.rank, .term).
# `stop` stops the ranks first, then etcd (SIGTERM, SIGKILL after 10 s), and removes its data;
# `status` lists the etcd members too.
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
etcd_members=0
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
    --etcd) etcd_members=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "fleet.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${bin:-${ORTHOSERVE_BUILD_DIR:-$root/build}/bin}
etcd_bin=${ORTHOSERVE_ETCD_BINARY:-/usr/bin/etcd}
etcd_client_port() { echo $((base + 150 + $1)); }
etcd_peer_port() { echo $((base + 160 + $1)); }

# term_pid_files TENTHS PIDFILE...: SIGTERM to the process of each pid file (started here, by pid),
# SIGKILL to those still running after TENTHS tenths of a second; removes the pid files (and an
# etcd member's .port file). A pattern that matched nothing is skipped.
term_pid_files() {
  local tenths=$1 pids=() f pid
  shift
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); }
    rm -f "$f" "${f%.pid}.port"
  done
  for _ in $(seq "$tenths"); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

stop() {
  [[ -d "$dir" ]] || return 0
  term_pid_files 150 "$dir"/rank*.pid
  rm -rf "$dir/fleet-tls"
  stop_etcd
}

stop_etcd() {  # After the ranks: SIGTERM to each member started here (by pid), SIGKILL after 10 s.
  term_pid_files 100 "$dir"/etcd*.pid
  rm -rf "$dir/etcd"
}

etcd_healthy() {  # etcd_healthy PORT: the member on that client port answers GET /health with "health":"true".
  local reply
  # shellcheck disable=SC2016  # $1 is the inner shell's argument
  reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3; cat <&3' _ "$1" 2>/dev/null) ||
    return 1
  [[ $reply == *'"health":"true"'* ]]
}

start_etcd() {  # Starts etcd_members members on loopback and waits until each is healthy.
  [[ -x "$etcd_bin" ]] ||
    { echo "fleet.sh: $etcd_bin not found: install Debian's etcd-server (scripts/setup.sh does) or set ORTHOSERVE_ETCD_BINARY" >&2; exit 2; }
  local i cluster=() deadline
  for ((i = 0; i < etcd_members; i++)); do cluster+=("m$i=http://127.0.0.1:$(etcd_peer_port "$i")"); done
  mkdir -p "$dir/etcd"
  for ((i = 0; i < etcd_members; i++)); do
    local client peer
    client="http://127.0.0.1:$(etcd_client_port "$i")" peer="http://127.0.0.1:$(etcd_peer_port "$i")"
    "$etcd_bin" --name "m$i" --data-dir "$dir/etcd/m$i.etcd" \
      --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$(IFS=,; echo "${cluster[*]}")" --initial-cluster-token "orthoserve-local-$base" \
      --initial-cluster-state new --logger zap --log-outputs stderr >"$dir/etcd$i.log" 2>&1 &
    echo $! >"$dir/etcd$i.pid"
    etcd_client_port "$i" >"$dir/etcd$i.port"
  done
  deadline=$((SECONDS + wait_s))
  for ((i = 0; i < etcd_members; i++)); do
    until etcd_healthy "$(etcd_client_port "$i")"; do
      if ! kill -0 "$(cat "$dir/etcd$i.pid")" 2>/dev/null || ((SECONDS > deadline)); then
        echo "fleet.sh: etcd member m$i did not become healthy; log tails:" >&2
        for ((q = 0; q < etcd_members; q++)); do echo "--- etcd m$q" >&2; tail -n 20 "$dir/etcd$q.log" >&2 || true; done
        stop
        exit 1
      fi
      sleep 0.2
    done
  done
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
    [[ $etcd_members == 0 || $etcd_members == 1 || $etcd_members == 3 ]] ||
      { echo "fleet.sh: --etcd $etcd_members: give 1 or 3 (members of the etcd cluster)" >&2; exit 2; }
    for ((i = 0; i < etcd_members; i++)); do
      for port in $(etcd_client_port "$i") $(etcd_peer_port "$i"); do
        ((port != 2379 && port != 2380)) ||
          { echo "fleet.sh: --base-port $base puts an etcd member on $port, etcd's default port; pick another" >&2; exit 2; }
      done
    done
    stop
    mkdir -p "$dir"
    if ((fleet_tls)); then
      "$root/deploy/local/fleet_certs.sh" fleet "$dir/fleet-tls" "$world" ||
        { echo "fleet.sh: could not make fleet certificates (openssl); --no-fleet-tls runs without" >&2; exit 2; }
    fi
    coordination=(--coordinator "127.0.0.1:$((base + 50))")
    if ((etcd_members)); then
      start_etcd
      endpoints=()
      for ((i = 0; i < etcd_members; i++)); do endpoints+=("127.0.0.1:$(etcd_client_port "$i")"); done
      coordination=(--membership "etcd://$(IFS=,; echo "${endpoints[*]}")/orthoserve/local-$base")
    fi
    for ((r = 0; r < world; r++)); do
      tls=()
      ((fleet_tls)) && tls=(--fleet-tls-cert "$dir/fleet-tls/rank$r.crt" --fleet-tls-key "$dir/fleet-tls/rank$r.key"
        --fleet-tls-ca "$dir/fleet-tls/ca.crt")
      "$bin/orthoserve" --rank "$r" --world "$world" \
        --listen "127.0.0.1:$((base + r))" --metrics-address "127.0.0.1:$((base + 100 + r))" \
        --fleet-listen "127.0.0.1:$((base + 50 + r))" "${coordination[@]}" \
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
    if ((etcd_members)); then
      echo "coordinator elected in etcd (${coordination[1]}; $etcd_members member(s), logs $dir/etcd*.log)"
    fi
    ;;
  stop) stop ;;
  status)
    for f in "$dir"/rank*.pid; do
      [[ -f "$f" ]] || continue
      r=${f##*/rank}; r=${r%.pid}
      if kill -0 "$(cat "$f")" 2>/dev/null; then state=running; else state=dead; fi
      echo "rank $r pid $(cat "$f") $state"
    done
    for f in "$dir"/etcd*.pid; do
      [[ -f "$f" ]] || continue
      i=${f##*/etcd}; i=${i%.pid}
      port=$(cat "$dir/etcd$i.port" 2>/dev/null) || port=""
      if ! kill -0 "$(cat "$f")" 2>/dev/null; then state=dead; elif [[ -n $port ]] && etcd_healthy "$port"; then
        state=healthy
      else state="running, not healthy"; fi
      echo "etcd m$i pid $(cat "$f") client 127.0.0.1:$port $state"
    done
    ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
