#!/usr/bin/env python3
"""Consistency checks for the deployment files, used by scripts/check_deploy.sh.

Each subcommand prints what it found and exits 1 with a message naming the file and the object
when a check fails. Needs PyYAML (from .venv-deploy); everything else is the standard library.
"""
import argparse
import json
import math
import pathlib
import re
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml


class CheckError(Exception):
    """A failed check; the message says what is wrong and where."""


# ---------------------------------------------------------------------------------------------
# PromQL metric names


# Words that look like identifiers in PromQL but are not metric names.
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                   "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"}
# Series that Prometheus itself makes for every target.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def promql_metric_names(expr):
    """Returns the metric names a PromQL expression selects (not functions, labels or keywords)."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"'(?:\\.|[^'\\])*'", "''", s)
    s = re.sub(r"`[^`]*`", "``", s)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![0-9A-Za-z_.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        token = m.group(0)
        if token in PROMQL_KEYWORDS:
            continue
        if s[m.end():].lstrip().startswith("("):  # a function or an aggregation
            continue
        names.add(token)
    return names


def grafana_to_promql(expr):
    """Replaces Grafana's template variables with values Prometheus accepts."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def dashboard_exprs(path):
    """Yields (panel title, PromQL) for every query of a Grafana dashboard JSON, variables included."""
    board = json.loads(pathlib.Path(path).read_text())

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield p.get("title", "?"), t["expr"]
            yield from walk(p.get("panels", []))

    yield from walk(board.get("panels", []))
    for v in board.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and q:
            m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)\s*", q)
            yield f"variable {v['name']}", m.group(1) if m else q


def rules_exprs(path):
    """Yields (rule name, PromQL) and the set of recorded names of a Prometheus rules file."""
    doc = yaml.safe_load(pathlib.Path(path).read_text())
    if doc.get("kind") == "PrometheusRule":
        doc = doc["spec"]
    out, recorded = [], set()
    for g in doc.get("groups", []):
        for r in g.get("rules", []):
            out.append((r.get("alert") or r.get("record"), r["expr"]))
            if "record" in r:
                recorded.add(r["record"])
    return out, recorded


def scraped_series_names(text):
    """Returns the series names a Prometheus text exposition can produce, from its # TYPE lines and samples."""
    names = set()
    for line in text.splitlines():
        m = re.match(r"#\s*TYPE\s+(\S+)\s+(\S+)", line)
        if m:
            name, kind = m.groups()
            if kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
            elif kind == "summary":
                names |= {name, name + "_sum", name + "_count"}
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def check_metric_names(scrape_path, dashboards, rules):
    exported = scraped_series_names(pathlib.Path(scrape_path).read_text())
    if not any(n.startswith("orthoserve_") for n in exported):
        raise CheckError(f"{scrape_path}: the scrape has no orthoserve_ metric at all")
    queries, recorded = [], set()
    for path in rules:
        exprs, rec = rules_exprs(path)
        recorded |= rec
        queries += [(f"{path}: {name}", e) for name, e in exprs]
    for path in dashboards:
        queries += [(f"{path}: panel {title!r}", e) for title, e in dashboard_exprs(path)]
    bad, used = [], set()
    for where, expr in queries:
        for name in sorted(promql_metric_names(expr)):
            used.add(name)
            if name not in exported and name not in recorded and name not in PROMETHEUS_SYNTHETIC:
                bad.append(f"{where}: metric {name} is not exported by the server (not in the scrape)")
    if bad:
        raise CheckError("\n".join(bad))
    families = sorted({n for n in used if n.startswith("orthoserve_")})
    print(f"metric names: {len(queries)} queries use {len(families)} server series, all in the scrape")
    families = re.findall(r"^#\s*TYPE\s+(orthoserve_\S+)\s+(\S+)", pathlib.Path(scrape_path).read_text(), re.M)
    unused = [f for f, kind in families
              if not ({f} | ({f + "_bucket", f + "_sum", f + "_count"} if kind in ("histogram", "summary") else set()))
              & used]
    if unused:
        print("  exported, on no panel or rule: " + ", ".join(unused))


# ---------------------------------------------------------------------------------------------
# Dashboard queries against a live Prometheus


def dashboard_variables(path):
    """Yields (variable name, PromQL, label) for every label_values(PromQL, label) query variable."""
    board = json.loads(pathlib.Path(path).read_text())
    for v in board.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") != "query" or not q:
            continue
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)\s*", q)
        if m:
            yield v["name"], m.group(1), m.group(2)
        else:
            yield v["name"], q, None


def prometheus_query(url, expr, timeout=5):
    """Evaluates an instant query; returns [(labels, value)] (a scalar: one sample without labels)."""
    query = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{query}", timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as e:  # 400/422: the query does not parse or evaluate.
        try:
            body = json.load(e)
        except ValueError:
            raise CheckError(f"{url}: HTTP {e.code} for {expr!r}") from None
    except (OSError, ValueError) as e:
        raise CheckError(f"{url}: cannot query Prometheus: {e}") from None
    if body.get("status") != "success":
        raise CheckError(f"query {expr!r}: {body.get('errorType', '?')}: {body.get('error', body)}")
    data = body["data"]
    if data["resultType"] == "scalar":
        return [({}, float(data["result"][1]))]
    if data["resultType"] == "vector":
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]
    raise CheckError(f"query {expr!r}: unexpected result type {data['resultType']}")


def describe_result(samples):
    if not samples:
        return "no series"
    finite = [v for _, v in samples if math.isfinite(v)]
    if not finite:
        return f"{len(samples)} series, none with a finite value ({samples[0][1]})"
    return f"{len(samples)} series, {len(finite)} finite"


def wait_prometheus_targets(url, selector, count, wait):
    """Waits until Prometheus has scraped `count` targets matching `selector` successfully."""
    deadline = time.monotonic() + wait
    last = "no answer"
    while True:
        try:
            samples = prometheus_query(url, f"up{{{selector}}} == 1")
            last = f"{len(samples)} of {count} targets up"
            if len(samples) >= count:
                print(f"{url}: {last} ({', '.join(sorted(s.get('pod', s.get('instance', '?')) for s, _ in samples))})")
                return
        except CheckError as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise CheckError(f"{url}: after {wait}s: {last}")
        time.sleep(0.5)


def check_dashboard_data(url, dashboards, rules, wait):
    """Every dashboard query (variables and panels) and every recording rule returns at least one
    series with a finite value from the Prometheus at `url` (retrying until `wait` seconds passed,
    while scrapes come in). A query that returns nothing or only NaN is a blank or broken panel."""
    checks = []  # (where, PromQL, label the series must carry or None)
    for path in dashboards:
        for name, expr, label in dashboard_variables(path):
            checks.append((f"{path}: variable {name}" + (f" (label {label})" if label else ""),
                           grafana_to_promql(expr), label))
        panel_queries = {}
        board = json.loads(pathlib.Path(path).read_text())

        def walk(panels):
            for p in panels:
                for t in p.get("targets", []):
                    if t.get("expr"):
                        panel_queries.setdefault((p.get("id"), p.get("title", "?")), []).append(
                            (t.get("refId", "?"), t["expr"]))
                walk(p.get("panels", []))

        walk(board.get("panels", []))
        for (_, title), targets in panel_queries.items():
            for ref, expr in targets:
                checks.append((f"{path}: panel {title!r} query {ref}", grafana_to_promql(expr), None))
    for path in rules:
        doc = yaml.safe_load(pathlib.Path(path).read_text())
        for g in doc.get("groups", []):
            for r in g.get("rules", []):
                if "record" in r:
                    checks.append((f"{path}: recording rule {r['record']}", r["expr"], None))
    if not checks:
        raise CheckError("no dashboard query or recording rule to check")
    deadline = time.monotonic() + wait
    pending = {i: "not queried" for i in range(len(checks))}
    while True:
        for i in list(pending):
            where, expr, label = checks[i]
            samples = prometheus_query(url, expr)
            if label is not None:
                samples = [(m, v) for m, v in samples if m.get(label)]
            if any(math.isfinite(v) for _, v in samples):
                print(f"  {describe_result(samples)}: {where}")
                del pending[i]
            else:
                pending[i] = describe_result(samples) + (f" carrying label {label}" if label else "")
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(1)
    if pending:
        raise CheckError("\n".join(f"{checks[i][0]}: {why} for {checks[i][1]!r} (a blank panel)"
                                    for i, why in sorted(pending.items())))
    print(f"dashboard data: all {len(checks)} queries (dashboard variables and panels, recording rules) "
          "return finite values")


def write_dashboard_rules(dashboard, out):
    """Writes the dashboard's queries as recording rules, so `promtool check rules` parses them."""
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)}
             for i, (_, e) in enumerate(dashboard_exprs(dashboard))]
    pathlib.Path(out).write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    print(f"{out}: {len(rules)} dashboard queries")


# ---------------------------------------------------------------------------------------------
# Rendered Kubernetes manifests


def load_objects(path):
    return [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def duration_seconds(text):
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise CheckError(f"cannot read duration {text!r}")
    return total


def fleet_statefulsets(objs):
    """The fleets of a render: StatefulSets with an orthoserve container (not, say, components/etcd's)."""
    return [o for o in objs if o["kind"] == "StatefulSet"
            and any(c["name"] == "orthoserve" for c in o["spec"]["template"]["spec"]["containers"])]


def etcd_statefulsets(objs):
    """StatefulSets running etcd (components/etcd): a container named etcd."""
    return [o for o in objs if o["kind"] == "StatefulSet"
            and any(c["name"] == "etcd" for c in o["spec"]["template"]["spec"]["containers"])]


def container(sts, name="orthoserve"):
    for c in sts["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise CheckError(f"StatefulSet {sts['metadata']['name']}: no container {name!r}")


def configmap_env(objs, c, owner):
    env = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef")
        if not ref:
            continue
        cms = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == ref["name"]]
        if not cms:
            raise CheckError(f"{owner}: envFrom names ConfigMap {ref['name']}, which is not in the render")
        env.update({k: str(v) for k, v in cms[0].get("data", {}).items()})
    return env


def pod_env(objs, sts, index, namespace):
    """The container's environment as the kubelet builds it for pod <sts>-<index>: envFrom, then env
    with fieldRefs filled in and $(VAR) references expanded."""
    name = sts["metadata"]["name"]
    c = container(sts)
    env = configmap_env(objs, c, f"StatefulSet {name}")
    fields = {"metadata.name": f"{name}-{index}", "metadata.namespace": namespace,
              "metadata.labels['apps.kubernetes.io/pod-index']": str(index)}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                    lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                raise CheckError(f"StatefulSet {name}: env {e['name']} uses fieldRef {path}, unknown to this check")
            env[e["name"]] = fields[path]
    return env


# Seconds the grace period must hold beyond preStop + drain: the server's backstop exits at drain +
# 10s after SIGTERM (the graceful leave of up to 5s and teardown come within it), plus 5s of slack.
TERMINATION_MARGIN_SECONDS = 15


def check_statefulset(objs, sts):
    name = sts["metadata"]["name"]
    where = f"StatefulSet {name}"
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"].get("labels", {})
    c = container(sts)
    errors = []

    def expect(ok, message):
        if not ok:
            errors.append(f"{where}: {message}")

    expect(spec.get("podManagementPolicy") == "Parallel", "podManagementPolicy must be Parallel (ranks rendezvous)")
    env_list = {e["name"]: e for e in c.get("env", [])}
    cm = configmap_env(objs, c, where)
    static = {k: v.get("value") for k, v in env_list.items()}
    expect(static.get("FLEET_STATEFULSET") == name,
           f"env FLEET_STATEFULSET is {static.get('FLEET_STATEFULSET')!r}, not the StatefulSet's name {name!r} "
           "(an overlay renamed it without `replacements`, see examples/cells)")
    expect(static.get("FLEET_SERVICE") == spec.get("serviceName"),
           f"env FLEET_SERVICE is {static.get('FLEET_SERVICE')!r}, not spec.serviceName {spec.get('serviceName')!r}")
    pod_index = env_list.get("ORTHOSERVE_POD_INDEX", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    expect(pod_index == "metadata.labels['apps.kubernetes.io/pod-index']",
           "ORTHOSERVE_POD_INDEX must come from the pod-index label")
    args = c.get("args", [])
    expect(cm.get("ORTHOSERVE_RANK") == "auto" or "--rank" in args and args[args.index("--rank") + 1] == "auto"
           or "--rank=auto" in args, "the rank must be `auto` (from the pod index)")
    world = cm.get("ORTHOSERVE_WORLD", "1")
    expect(str(spec.get("replicas", 1)) == world,
           f"replicas {spec.get('replicas', 1)} differs from ORTHOSERVE_WORLD {world} in the ConfigMap")

    # The headless Service behind serviceName: stable DNS for every pod, ready or not.
    svcs = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == spec.get("serviceName")]
    if not svcs:
        errors.append(f"{where}: serviceName {spec.get('serviceName')!r} is not a Service in the render")
    else:
        svc = svcs[0]["spec"]
        expect(svc.get("clusterIP") == "None", f"Service {spec['serviceName']} must be headless (clusterIP: None)")
        expect(svc.get("publishNotReadyAddresses") is True,
               f"Service {spec['serviceName']} needs publishNotReadyAddresses: true (the fleet forms before readiness)")
        expect(selects(svc.get("selector"), labels), f"Service {spec['serviceName']} does not select the pods")
        fleet_port = int(cm.get("ORTHOSERVE_FLEET_LISTEN", ":50061").rsplit(":", 1)[1])
        expect(any(p["port"] == fleet_port for p in svc.get("ports", [])),
               f"Service {spec['serviceName']} does not expose the fleet port {fleet_port}")
    env1 = pod_env(objs, sts, 1, "ns")
    membership = env1.get("ORTHOSERVE_MEMBERSHIP", "static")
    if membership.startswith("etcd://"):
        errors += [f"{where}: {e}" for e in check_etcd_membership(objs, sts, env1)]
    else:
        expect(membership == "static", f"ORTHOSERVE_MEMBERSHIP {membership!r} is neither static nor etcd://...")
        expect(f"{name}-0.{spec.get('serviceName')}." in env1.get("ORTHOSERVE_COORDINATOR", ""),
               "ORTHOSERVE_COORDINATOR must name pod 0 through the headless Service")

    fleet_port = int(cm.get("ORTHOSERVE_FLEET_LISTEN", ":50061").rsplit(":", 1)[1])
    # Graceful termination: preStop, then SIGTERM: the drain (up to ORTHOSERVE_DRAIN_TIMEOUT), the
    # graceful leave of the fleet (up to 5s) and teardown, which the server's backstop ends at
    # drain + 10s after SIGTERM; plus 5s of slack before the kubelet's SIGKILL.
    drain = duration_seconds(cm.get("ORTHOSERVE_DRAIN_TIMEOUT", "0s"))
    pre = c.get("lifecycle", {}).get("preStop", {})
    pre_sleep = 0
    if "exec" in pre and pre["exec"]["command"][:1] == ["sleep"]:
        pre_sleep = duration_seconds(pre["exec"]["command"][1] + "s")
    elif "sleep" in pre:
        pre_sleep = pre["sleep"]["seconds"]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    expect(grace >= drain + pre_sleep + TERMINATION_MARGIN_SECONDS,
           f"terminationGracePeriodSeconds {grace} < drain {drain:g}s + preStop {pre_sleep:g}s + "
           f"{TERMINATION_MARGIN_SECONDS}s (fleet leave and the server's 10s backstop margin, 5s slack)")

    # Probes. Readiness: the public port's health (SERVING while the rank takes calls, fleet member
    # or not; NOT_SERVING once it drains), natively or, under TLS, through `orthoctl health`.
    # Liveness: the fleet port's health, NOT_SERVING only when the rank is wedged, natively or,
    # under fleet TLS, through `orthoctl health` with the fleet certificate; the public port's
    # turns NOT_SERVING during a drain, which must not kill the pod.
    listen_port = int(cm.get("ORTHOSERVE_LISTEN", ":50051").rsplit(":", 1)[1])
    ready, live = c.get("readinessProbe"), c.get("livenessProbe")
    expect(ready is not None and live is not None, "needs a readinessProbe and a livenessProbe")
    if ready and "grpc" in ready:
        expect(ready["grpc"]["port"] == listen_port and ready["grpc"].get("service") == "orthoserve.v1.Orthogonalizer",
               f"readinessProbe must be gRPC on the listen port {listen_port}, service orthoserve.v1.Orthogonalizer")
        expect(not cm.get("ORTHOSERVE_TLS_CERT"), "readinessProbe is a plaintext gRPC probe but the port is under TLS")
    elif ready:
        cmd = " ".join(ready.get("exec", {}).get("command", []))
        expect("orthoctl health" in cmd and f":{listen_port}" in cmd,
               f"readinessProbe must be a gRPC probe or `orthoctl health` on port {listen_port}")
        expect(not cm.get("ORTHOSERVE_TLS_CERT") or "--tls-ca" in cmd, "readinessProbe must use TLS like the server")
    fleet_tls = {k: cm.get(f"ORTHOSERVE_FLEET_TLS_{k}") for k in ("CERT", "KEY", "CA")}
    if live and fleet_tls["CERT"]:
        # Under fleet TLS the fleet port's health speaks mutual TLS, which the kubelet's gRPC
        # probe cannot: `orthoctl health` with the fleet certificate, checking this rank's name.
        cmd = " ".join(live.get("exec", {}).get("command", []))
        expect("grpc" not in live, "livenessProbe is a plaintext gRPC probe but the fleet port is under fleet TLS")
        expect("orthoctl health" in cmd and f":{fleet_port}" in cmd and "--tls-server-name" in cmd
               and all(f"{flag}={fleet_tls[k]}" in cmd for flag, k in
                       (("--tls-ca", "CA"), ("--tls-cert", "CERT"), ("--tls-key", "KEY"))),
               f"livenessProbe must be `orthoctl health` on the fleet port {fleet_port} with the fleet certificate "
               "the server uses (--tls-ca, --tls-cert, --tls-key) and --tls-server-name")
    elif live:
        expect(live.get("grpc", {}).get("port") == fleet_port and not live["grpc"].get("service"),
               f"livenessProbe must be gRPC on the fleet port {fleet_port} (service \"\")")
    errors += check_fleet_tls(objs, sts, cm, fleet_tls)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    expect(bool(shm) and volumes.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
           "/dev/shm must be a memory emptyDir")
    for key, value in cm.items():
        if key.endswith("_FILE") or key in ("ORTHOSERVE_TLS_CERT", "ORTHOSERVE_TLS_KEY", "ORTHOSERVE_TLS_CLIENT_CA",
                                            "ORTHOSERVE_FLEET_TLS_CERT", "ORTHOSERVE_FLEET_TLS_KEY",
                                            "ORTHOSERVE_FLEET_TLS_CA", "ORTHOSERVE_ETCD_TLS_CA",
                                            "ORTHOSERVE_ETCD_TLS_CERT", "ORTHOSERVE_ETCD_TLS_KEY"):
            expect(any(value.startswith(m["mountPath"].rstrip("/") + "/") for m in c.get("volumeMounts", [])),
                   f"{key}={value} is on no mounted volume")
    if cm.get("ORTHOSERVE_BACKEND") == "cuda":
        expect(str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")) == "1",
               "backend cuda needs nvidia.com/gpu: 1 in limits")

    # NetworkPolicy: public and metrics ports open, everything else only from the fleet's own pods.
    pols = [o for o in objs if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"].get("matchLabels"),
                                                                        labels)]
    expect(bool(pols), "no NetworkPolicy selects the fleet pods")
    fleet_port = int(cm.get("ORTHOSERVE_FLEET_LISTEN", ":50061").rsplit(":", 1)[1])
    for pol in pols:
        for rule in pol["spec"].get("ingress", []):
            ports = {p.get("port") for p in rule.get("ports", [])}
            if not rule.get("ports") or fleet_port in ports:
                peers = rule.get("from", [])
                expect(bool(peers) and all(p.get("podSelector") and not p.get("namespaceSelector")
                                           and selects(p["podSelector"].get("matchLabels"), labels) for p in peers),
                       f"NetworkPolicy {pol['metadata']['name']} opens the fleet port to pods outside the fleet")
    # Egress: only to the fleet's own pods and the cluster DNS (port 53); no rule open to everywhere.
    egress_pols = [p for p in pols if "Egress" in p["spec"].get("policyTypes", [])]
    expect(bool(egress_pols), "no NetworkPolicy limits the fleet pods' egress (policyTypes without Egress)")
    dns = own = False
    for pol in egress_pols:
        for rule in pol["spec"].get("egress", []):
            peers = rule.get("to", [])
            expect(bool(peers), f"NetworkPolicy {pol['metadata']['name']} has an egress rule to everywhere")
            ports = {(p.get("port"), p.get("protocol", "TCP")) for p in rule.get("ports", [])}
            for peer in peers:
                if "ipBlock" in peer:
                    expect(peer["ipBlock"].get("cidr") not in ("0.0.0.0/0", "::/0"),
                           f"NetworkPolicy {pol['metadata']['name']} lets the fleet pods reach any address")
                elif peer.get("podSelector") and not peer.get("namespaceSelector"):
                    own = own or selects(peer["podSelector"].get("matchLabels"), labels)
                    # The one other pods the fleet may reach: components/etcd's members, on their client port.
                    to_etcd = bool(ports) and any(
                        selects(peer["podSelector"].get("matchLabels"), e["spec"]["template"]["metadata"]["labels"])
                        and ports <= {(etcd_client_port(e), "TCP")} for e in etcd_statefulsets(objs))
                    expect(selects(peer["podSelector"].get("matchLabels"), labels) or to_etcd,
                           f"NetworkPolicy {pol['metadata']['name']} lets the fleet pods reach pods outside the fleet")
                else:
                    expect(bool(ports) and all(port == 53 for port, _ in ports),
                           f"NetworkPolicy {pol['metadata']['name']} lets the fleet pods reach other namespaces on "
                           f"ports other than DNS: {sorted(ports)}")
                    dns = dns or {(53, "UDP"), (53, "TCP")} <= ports
    expect(own, "no egress rule lets the fleet pods reach each other (the coordinator, peers, the collective)")
    expect(dns, "no egress rule lets the fleet pods reach the cluster DNS (port 53, UDP and TCP)")
    # Scratch space is bounded: an emptyDir without a sizeLimit can fill the node's disk or memory.
    for v in pod.get("volumes", []):
        if "emptyDir" in v:
            expect(bool((v["emptyDir"] or {}).get("sizeLimit")), f"emptyDir volume {v['name']} has no sizeLimit")
    rate = cm.get("ORTHOSERVE_MAX_TENANT_CALLS_PER_SECOND", "0")
    expect(float(rate) > 0, f"ORTHOSERVE_MAX_TENANT_CALLS_PER_SECOND is {rate!r}: set the call-rate limit")
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget" and selects(o["spec"]["selector"].get("matchLabels"),
                                                                               labels)]
    expect(len(pdbs) == 1, f"{len(pdbs)} PodDisruptionBudgets select the fleet pods, want 1")
    # Disruptions: the fleet goes on without any one rank (and takes it back), not without two at
    # once; so node drains and rollouts take one rank at a time, and never none (a PDB that allows
    # no eviction blocks node drains for good).
    replicas = int(spec.get("replicas", 1))
    for pdb in pdbs:
        budget = pdb["spec"]
        one = (budget.get("maxUnavailable") == 1 if "maxUnavailable" in budget
               else budget.get("minAvailable") == replicas - 1)
        expect(one, f"PodDisruptionBudget {pdb['metadata']['name']} must allow exactly one rank down "
               f"(maxUnavailable: 1), not maxUnavailable {budget.get('maxUnavailable')!r} / minAvailable "
               f"{budget.get('minAvailable')!r}")
    update = spec.get("updateStrategy", {})
    expect(update.get("type", "RollingUpdate") == "RollingUpdate",
           f"updateStrategy.type must be RollingUpdate, not {update.get('type')!r}")
    at_once = update.get("rollingUpdate", {}).get("maxUnavailable", 1)
    expect(at_once == 1, f"updateStrategy.rollingUpdate.maxUnavailable is {at_once!r}: the fleet tolerates one rank "
           "down at a time, so it must be 1")
    mons = [o for o in objs if o["kind"] == "ServiceMonitor"]
    expect(not mons or (any(selects(m["spec"]["selector"].get("matchLabels"), svcs[0]["metadata"].get("labels", {}))
               for m in mons) if svcs else False), "no ServiceMonitor selects the headless Service")
    other_cells = [s for s in fleet_statefulsets(objs) if s is not sts]
    for m in mons:
        sel = m["spec"]["selector"].get("matchLabels")
        if svcs and selects(sel, svcs[0]["metadata"].get("labels", {})):
            for o in other_cells:
                other = [x for x in objs if x["kind"] == "Service" and x["metadata"]["name"] == o["spec"]["serviceName"]]
                expect(not (other and selects(sel, other[0]["metadata"].get("labels", {}))),
                       f"ServiceMonitor {m['metadata']['name']} also selects {o['metadata']['name']}'s Service")
    return errors


def etcd_client_port(sts):
    """The client port of an etcd StatefulSet (its container port named client; 2379 by default)."""
    ports = container(sts, "etcd").get("ports", [])
    return next((p["containerPort"] for p in ports if p.get("name") == "client"), 2379)


def parse_etcd_membership(value):
    """(["host:port", ...], prefix) of etcd://HOST:PORT[,HOST:PORT...]/PREFIX."""
    rest = value[len("etcd://"):]
    hosts, slash, prefix = rest.partition("/")
    return [h for h in hosts.split(",") if h], slash + prefix


def egress_reaches(objs, fleet_labels, host, port):
    """Whether some NetworkPolicy over the fleet's pods lets them reach HOST:PORT (an IP in an
    ipBlock, or the pods of an etcd StatefulSet whose pod name HOST is)."""
    import ipaddress
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for pol in objs:
        if pol["kind"] != "NetworkPolicy" or not selects(pol["spec"]["podSelector"].get("matchLabels"), fleet_labels):
            continue
        for rule in pol["spec"].get("egress", []):
            ports = {p.get("port") for p in rule.get("ports", [])}
            if rule.get("ports") and port not in ports:
                continue
            for peer in rule.get("to", []):
                if ip is not None and "ipBlock" in peer:
                    block = peer["ipBlock"]
                    if ip in ipaddress.ip_network(block["cidr"], strict=False) and not any(
                            ip in ipaddress.ip_network(x, strict=False) for x in block.get("except", [])):
                        return True
                elif ip is None and peer.get("podSelector") and not peer.get("namespaceSelector"):
                    for e in etcd_statefulsets(objs):
                        pod = host.split(".")[0]
                        if (pod.rsplit("-", 1)[0] == e["metadata"]["name"]
                                and selects(peer["podSelector"].get("matchLabels"),
                                            e["spec"]["template"]["metadata"]["labels"])):
                            return True
    return False


def check_etcd_membership(objs, sts, env):
    """A fleet with --membership etcd://: no ORTHOSERVE_COORDINATOR (the server refuses both), a
    prefix, and every endpoint reachable through the fleet's egress rules; with an etcd StatefulSet
    in the render (components/etcd), the endpoints are exactly its members, by their stable names
    under its headless Service, on its client port."""
    errors = []
    membership = env["ORTHOSERVE_MEMBERSHIP"]
    labels = sts["spec"]["template"]["metadata"].get("labels", {})
    if "ORTHOSERVE_COORDINATOR" in env:
        errors.append("ORTHOSERVE_MEMBERSHIP is etcd:// but ORTHOSERVE_COORDINATOR is set (the server refuses both; "
                      "components/etcd removes it)")
    endpoints, prefix = parse_etcd_membership(membership)
    if not endpoints or len(prefix) < 2:
        errors.append(f"ORTHOSERVE_MEMBERSHIP {membership!r} is not etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
        return errors
    for e in etcd_statefulsets(objs):
        name, svc, port = e["metadata"]["name"], e["spec"].get("serviceName"), etcd_client_port(e)
        want = [f"{name}-{i}.{svc}:{port}" for i in range(int(e["spec"].get("replicas", 1)))]
        if endpoints != want:
            errors.append(f"ORTHOSERVE_MEMBERSHIP lists {endpoints}, not the members of etcd StatefulSet {name}: {want}")
        svcs = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == svc]
        if not svcs or svcs[0]["spec"].get("clusterIP") != "None" or svcs[0]["spec"].get("publishNotReadyAddresses") \
                is not True:
            errors.append(f"etcd StatefulSet {name} needs its headless Service {svc} with publishNotReadyAddresses")
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not egress_reaches(objs, labels, host, int(port)):
            errors.append(f"no egress rule lets the fleet pods reach etcd at {endpoint}")
    return errors


def check_etcd_example(path, members, external):
    """The etcd examples: every fleet elects its coordinator in etcd; with MEMBERS, the render ships
    an etcd StatefulSet of that many replicas; with EXTERNAL, it ships none (etcd runs elsewhere)."""
    objs = load_objects(path)
    fleets, etcds = fleet_statefulsets(objs), etcd_statefulsets(objs)
    errors = []
    if not fleets:
        errors.append("no fleet StatefulSet")
    for sts in fleets:
        env = pod_env(objs, sts, 0, EXAMPLE_NAMESPACE)
        membership = env.get("ORTHOSERVE_MEMBERSHIP", "")
        where = f"StatefulSet {sts['metadata']['name']}"
        if not membership.startswith("etcd://"):
            errors.append(f"{where}: ORTHOSERVE_MEMBERSHIP is {membership!r}, not etcd://...")
            continue
        errors += [f"{where}: {e}" for e in check_etcd_membership(objs, sts, env)]
        print(f"{where}: ORTHOSERVE_MEMBERSHIP={membership}; no ORTHOSERVE_COORDINATOR; egress to every endpoint")
    if external and etcds:
        errors.append(f"etcd runs elsewhere but the render has etcd StatefulSet(s) {[e['metadata']['name'] for e in etcds]}")
    if members:
        if len(etcds) != 1:
            errors.append(f"want one etcd StatefulSet, the render has {len(etcds)}")
        for e in etcds:
            replicas = int(e["spec"].get("replicas", 1))
            if replicas != members:
                errors.append(f"etcd StatefulSet {e['metadata']['name']} has {replicas} replicas, want {members}")
            env = {x["name"]: x.get("value", "") for x in container(e, "etcd").get("env", [])}
            named = env.get("ETCD_INITIAL_CLUSTER", "").count("=")
            if named != replicas:
                errors.append(f"etcd StatefulSet {e['metadata']['name']}: ETCD_INITIAL_CLUSTER names {named} members, "
                              f"replicas is {replicas}")
            else:
                print(f"etcd StatefulSet {e['metadata']['name']}: {replicas} replicas, all in ETCD_INITIAL_CLUSTER")
    if errors:
        raise CheckError("\n".join(f"{path}: {e}" for e in errors))


# The namespace the examples are applied to (`kubectl apply -k ... -n orthoserve`): certificates
# name it, since a pod's DNS name does.
EXAMPLE_NAMESPACE = "orthoserve"
FLEET_TLS_SECRET = "orthoserve-fleet-tls"


def dns_name_matches(name, san):
    """Whether DNS SAN `san` covers `name` (exact, or a wildcard over one leftmost label)."""
    name, san = name.lower().rstrip("."), san.lower().rstrip(".")
    if san.startswith("*."):
        first, _, rest = name.partition(".")
        return bool(first) and rest == san[2:] and san[2:].count(".") >= 1
    return name == san


def check_fleet_tls(objs, sts, cm, fleet_tls):
    """The fleet port's mutual TLS: on (the base turns it on), its files from the mounted Secret
    orthoserve-fleet-tls, every rank's member name the pod's DNS name, and a cert-manager
    Certificate for that Secret (components/fleet-tls-cert-manager), where there is one, issued
    for every pod's member name with both TLS usages by an Issuer of the render."""
    name, spec = sts["metadata"]["name"], sts["spec"]
    where = f"StatefulSet {name}"
    c = container(sts)
    errors = []

    def expect(ok, message):
        if not ok:
            errors.append(f"{where}: {message}")

    expect(all(fleet_tls.values()), "the fleet port must run with mutual TLS: ORTHOSERVE_FLEET_TLS_CERT, "
           f"ORTHOSERVE_FLEET_TLS_KEY and ORTHOSERVE_FLEET_TLS_CA are {fleet_tls}")
    if not all(fleet_tls.values()):
        return errors
    replicas = int(spec.get("replicas", 1))
    for index in sorted({0, replicas - 1}):
        env = pod_env(objs, sts, index, EXAMPLE_NAMESPACE)
        member = env.get("ORTHOSERVE_FLEET_TLS_MEMBER_NAME", "orthoserve-rank-{rank}").replace("{rank}", str(index))
        pod_dns = f"{name}-{index}.{spec.get('serviceName')}.{EXAMPLE_NAMESPACE}.svc"
        expect(member == pod_dns, f"pod {index}'s fleet member name is {member!r}, not its DNS name {pod_dns!r} "
               "(ORTHOSERVE_FLEET_TLS_MEMBER_NAME: $(FLEET_STATEFULSET)-{rank}.$(FLEET_SERVICE).$(POD_NAMESPACE).svc)")
    # The Secret mounted where the fleet TLS files are.
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"].get("volumes", [])}
    secret = None
    for m in c.get("volumeMounts", []):
        if fleet_tls["CERT"].startswith(m["mountPath"].rstrip("/") + "/"):
            secret = volumes.get(m["name"], {}).get("secret", {}).get("secretName")
    expect(secret == FLEET_TLS_SECRET, f"the fleet TLS files must come from the Secret {FLEET_TLS_SECRET}, not {secret!r}")
    issuers = {o["metadata"]["name"] for o in objs if o["kind"] in ("Issuer", "ClusterIssuer")}
    for cert in (o for o in objs if o["kind"] == "Certificate" and o["spec"].get("secretName") == secret):
        cname, cspec = cert["metadata"]["name"], cert["spec"]
        usages = set(cspec.get("usages", []))
        expect({"server auth", "client auth"} <= usages,
               f"Certificate {cname} needs the usages server auth and client auth (a member is both), has {sorted(usages)}")
        expect(cspec.get("issuerRef", {}).get("name") in issuers,
               f"Certificate {cname}'s issuer {cspec.get('issuerRef', {}).get('name')!r} is not in the render")
        for index in sorted({0, replicas - 1}):
            pod_dns = f"{name}-{index}.{spec.get('serviceName')}.{EXAMPLE_NAMESPACE}.svc"
            expect(any(dns_name_matches(pod_dns, san) for san in cspec.get("dnsNames", [])),
                   f"Certificate {cname}'s dnsNames {cspec.get('dnsNames')} do not cover pod {index}'s member name {pod_dns}")
    return errors


def check_cert_manager_object(obj):
    """Required fields of cert-manager.io/v1 Issuer and Certificate (CRDs the schema validator lacks)."""
    where = f"{obj['kind']} {obj.get('metadata', {}).get('name')}"
    spec = obj.get("spec", {})
    if obj["kind"] == "Issuer":
        kinds = [k for k in ("selfSigned", "ca", "acme", "vault", "venafi") if k in spec]
        if len(kinds) != 1:
            return [f"{where}: spec needs exactly one of selfSigned, ca, acme, vault, venafi"]
        if kinds == ["ca"] and not spec["ca"].get("secretName"):
            return [f"{where}: spec.ca.secretName is required"]
        return []
    errors = []
    if not spec.get("secretName"):
        errors.append(f"{where}: spec.secretName is required")
    if not spec.get("issuerRef", {}).get("name"):
        errors.append(f"{where}: spec.issuerRef.name is required")
    if not (spec.get("dnsNames") or spec.get("commonName") or spec.get("uris") or spec.get("ipAddresses")):
        errors.append(f"{where}: needs dnsNames (or commonName, uris, ipAddresses)")
    known = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign", "crl sign"}
    if not set(spec.get("usages", [])) <= known:
        errors.append(f"{where}: unknown usages {sorted(set(spec.get('usages', [])) - known)}")
    return errors


def check_servicemonitor(mon):
    """Required fields of monitoring.coreos.com/v1 ServiceMonitor (a CRD the schema validator lacks)."""
    errors = []
    name = mon.get("metadata", {}).get("name")
    where = f"ServiceMonitor {name}"
    if mon.get("apiVersion") != "monitoring.coreos.com/v1":
        errors.append(f"{where}: apiVersion must be monitoring.coreos.com/v1")
    if not name:
        errors.append("ServiceMonitor without metadata.name")
    spec = mon.get("spec", {})
    if not isinstance(spec.get("selector"), dict):
        errors.append(f"{where}: spec.selector is required")
    eps = spec.get("endpoints")
    if not isinstance(eps, list) or not eps:
        errors.append(f"{where}: spec.endpoints must be a non-empty list")
    known = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings",
             "metricRelabelings", "tlsConfig", "bearerTokenSecret", "authorization", "params", "followRedirects"}
    for i, ep in enumerate(eps or []):
        extra = set(ep) - known
        if extra:
            errors.append(f"{where}: endpoints[{i}] has unknown fields {sorted(extra)}")
        if "port" not in ep and "targetPort" not in ep:
            errors.append(f"{where}: endpoints[{i}] needs port or targetPort")
        if "interval" in ep and not re.fullmatch(r"(\d+(ms|s|m|h))+", ep["interval"]):
            errors.append(f"{where}: endpoints[{i}].interval {ep['interval']!r} is not a duration")
        for j, r in enumerate(ep.get("relabelings", [])):
            if not set(r) <= {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}:
                errors.append(f"{where}: endpoints[{i}].relabelings[{j}] has unknown fields")
    return errors


def check_rendered(path):
    objs = load_objects(path)
    errors = []
    stss = fleet_statefulsets(objs)
    if not stss:
        errors.append("no StatefulSet")
    for sts in stss:
        errors += check_statefulset(objs, sts)
    if errors:
        raise CheckError("\n".join(f"{path}: {e}" for e in errors))
    print(f"{path}: {len(objs)} objects, {len(stss)} fleet(s) consistent")


def print_pod_env(path, statefulset, index, namespace):
    objs = load_objects(path)
    stss = [o for o in fleet_statefulsets(objs) if not statefulset or o["metadata"]["name"] == statefulset]
    if not stss:
        raise CheckError(f"{path}: no StatefulSet {statefulset!r}")
    sts = stss[0]
    env = pod_env(objs, sts, index, namespace)
    env["HOSTNAME"] = f"{sts['metadata']['name']}-{index}"
    for k, v in sorted(env.items()):
        print(f"{k}={v}")
    c = container(sts)
    print("#ARGS " + shlex.join(c.get("args", [])))
    for m in c.get("volumeMounts", []):
        print(f"#MOUNT {m['mountPath']}")


# Kinds served by custom resource definitions: the Kubernetes schema validator does not know them,
# so they are checked here instead (required fields, see check_servicemonitor/check_prometheusrule).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
             ("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


def check_prometheusrule_object(obj):
    errors = []
    where = f"PrometheusRule {obj.get('metadata', {}).get('name')}"
    groups = obj.get("spec", {}).get("groups")
    if not isinstance(groups, list) or not groups:
        return [f"{where}: spec.groups must be a non-empty list"]
    for g in groups:
        if not g.get("name") or not isinstance(g.get("rules"), list):
            errors.append(f"{where}: every group needs a name and rules")
            continue
        for r in g["rules"]:
            if ("alert" in r) == ("record" in r) or "expr" not in r:
                errors.append(f"{where}: group {g['name']}: each rule needs expr and exactly one of alert/record")
    return errors


def split_rendered(path, builtin_out, crd_out):
    """Writes the built-in kinds (for kubernetes-validate) and the CRD objects (checked here) apart."""
    objs = load_objects(path)
    builtin, crds, errors = [], [], []
    for o in objs:
        key = (o.get("apiVersion"), o.get("kind"))
        if "." in key[0].split("/")[0] and not key[0].split("/")[0].endswith(".k8s.io"):
            if key not in CRD_KINDS:
                errors.append(f"{path}: {key[1]} ({key[0]}) is a custom resource this check does not know")
            crds.append(o)
        else:
            builtin.append(o)
    for o in crds:
        if o["kind"] == "ServiceMonitor":
            errors += check_servicemonitor(o)
        elif o["kind"] == "PrometheusRule":
            errors += check_prometheusrule_object(o)
        elif o["apiVersion"] == "cert-manager.io/v1":
            errors += check_cert_manager_object(o)
    if errors:
        raise CheckError("\n".join(errors))
    pathlib.Path(builtin_out).write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    pathlib.Path(crd_out).write_text(yaml.safe_dump_all(crds, sort_keys=False))
    print(f"{path}: {len(builtin)} built-in objects for the schema validator; "
          f"{len(crds)} custom resources ({', '.join(sorted({o['kind'] for o in crds})) or 'none'}) checked here")


def print_probe_command(path, statefulset, probe):
    """Prints an exec probe's command as one shell script (the `sh -c` script itself if it is one)."""
    sts = next((o for o in fleet_statefulsets(load_objects(path))
                if not statefulset or o["metadata"]["name"] == statefulset), None)
    if sts is None:
        raise CheckError(f"{path}: no StatefulSet {statefulset!r}")
    cmd = container(sts).get(probe, {}).get("exec", {}).get("command")
    if not cmd:
        raise CheckError(f"{path}: {probe} of {sts['metadata']['name']} is not an exec probe")
    print(cmd[2] if cmd[:2] == ["sh", "-c"] and len(cmd) == 3 else shlex.join(cmd))


def write_npy(path, rows, cols, seed=1):
    """Writes a float32 C-order .npy of deterministic values in [-1, 1) (standard library only)."""
    import random
    import struct
    rng = random.Random(seed)
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    data = struct.pack(f"<{rows * cols}f", *(rng.uniform(-1, 1) for _ in range(rows * cols)))
    pathlib.Path(path).write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)


def print_dockerfile_run(dockerfile, stage, needle):
    """Prints the RUN command of a stage that contains `needle` (continuation lines joined)."""
    for name, _, insts in dockerfile_stages(dockerfile):
        if name == stage:
            for inst, arg in insts:
                if inst == "RUN" and needle in arg:
                    print(arg)
                    return
    raise CheckError(f"{dockerfile}: stage {stage} has no RUN containing {needle!r}")


def list_statefulsets(path):
    for o in fleet_statefulsets(load_objects(path)):
        print(o["metadata"]["name"], o["spec"].get("replicas", 1))


# ---------------------------------------------------------------------------------------------
# Dockerfile and README


def shell_commands(text):
    """Splits shell text into simple commands (on newlines, &&, ||, ;), joining continuation lines."""
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        for part in re.split(r"&&|\|\||;", line):
            part = part.strip()
            if part.startswith("$ "):
                part = part[2:]
            if part:
                out.append(part)
    return out


def setup_invocations(commands):
    """Returns (env assignments dict, args) for each call of ./scripts/setup.sh."""
    found = []
    for cmd in commands:
        try:
            words = shlex.split(cmd)
        except ValueError:
            continue
        env = {}
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            k, v = words.pop(0).split("=", 1)
            env[k] = v
        if words and words[0] == "env":
            words.pop(0)
            while words and "=" in words[0]:
                k, v = words.pop(0).split("=", 1)
                env[k] = v
        if words and words[0] in ("./scripts/setup.sh", "scripts/setup.sh", "bash scripts/setup.sh"):
            found.append((env, words[1:]))
    return found


def readme_first_shell_block(path):
    if not pathlib.Path(path).exists():
        raise CheckError(f"{path} does not exist")
    m = re.search(r"```(?:sh|bash|shell|console)\s*\n(.*?)```", pathlib.Path(path).read_text(), re.S)
    if not m:
        raise CheckError(f"{path}: no ```sh block")
    return m.group(1)


def dockerfile_stages(path):
    """Returns [(stage name, base, [(instruction, argument)])] with continuation lines joined."""
    text = re.sub(r"\\\n", " ", pathlib.Path(path).read_text())
    stages, current = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        inst, _, arg = line.partition(" ")
        inst = inst.upper()
        if inst == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", arg, re.I)
            current = (m.group(2) or str(len(stages)), m.group(1), [])
            stages.append(current)
        elif current is not None:
            current[2].append((inst, arg.strip()))
    return stages


# Options the image build may set on its own (they are about the image, not about how it builds).
DOCKER_ONLY_SETUP_ENV = {"ORTHOSERVE_SKIP_VENV", "ORTHOSERVE_WITH_CUDA", "ORTHOSERVE_JOBS", "ORTHOSERVE_SKIP_APT"}


def check_dockerfile_readme(dockerfile, readme):
    block = readme_first_shell_block(readme)
    readme_cmds = shell_commands(block)
    readme_setup = setup_invocations(readme_cmds)
    if not readme_setup:
        raise CheckError(f"{readme}: the first shell block does not run ./scripts/setup.sh")
    r_env, r_args = readme_setup[0]
    if any(inv != readme_setup[0] for inv in readme_setup):
        raise CheckError(f"{readme}: the first shell block calls ./scripts/setup.sh in different ways: {readme_setup}")
    m = re.search(r"\./(\S*?)/bin/orthoserve\b", block)
    if not m:
        raise CheckError(f"{readme}: the first shell block does not start <build dir>/bin/orthoserve")
    build_dir = m.group(1)
    errors = []
    stages = dockerfile_stages(dockerfile)
    build_stages = [s for s in stages if any(i == "RUN" and setup_invocations(shell_commands(a)) for i, a in s[2])]
    if not build_stages:
        errors.append(f"{dockerfile}: no stage runs ./scripts/setup.sh (the README's build)")
    for name, _, insts in build_stages:
        for inst, arg in insts:
            if inst != "RUN":
                continue
            for cmd in shell_commands(arg):
                words = cmd.split()
                if words and words[0] in ("cmake", "ninja", "make", "apt-get", "apt", "pip", "pip3"):
                    errors.append(f"{dockerfile}: stage {name} runs `{cmd}` itself; the build steps must be the "
                                  "README's (./scripts/setup.sh), so they cannot drift apart")
            for d_env, d_args in setup_invocations(shell_commands(arg)):
                if d_args != r_args:
                    errors.append(f"{dockerfile}: stage {name} calls setup.sh with {d_args}, the README with {r_args}")
                for k in sorted(set(r_env) | set(d_env)):
                    if k in DOCKER_ONLY_SETUP_ENV:
                        continue
                    if r_env.get(k) != d_env.get(k):
                        errors.append(f"{dockerfile}: stage {name} sets {k}={d_env.get(k)!r}, the README "
                                      f"{k}={r_env.get(k)!r}")
                if d_env.get("ORTHOSERVE_BUILD_DIR", "build") != build_dir:
                    errors.append(f"{dockerfile}: stage {name} builds into {d_env.get('ORTHOSERVE_BUILD_DIR', 'build')}"
                                  f", the README runs {build_dir}/bin/orthoserve")
    build_names = {s[0] for s in build_stages}
    copies = [(s[0], a) for s in stages for i, a in s[2] if i == "COPY" and "--from=" in a]
    for binary in ("orthoserve", "orthoctl"):
        if not any(f"{build_dir}/bin/{binary}" in a and re.search(r"--from=(\S+)", a).group(1) in build_names
                   for _, a in copies):
            errors.append(f"{dockerfile}: no stage copies {build_dir}/bin/{binary} from a build stage")
    final = [s for s in stages if s[0] not in build_names]
    for name, _, insts in final:
        if any(i == "ENTRYPOINT" for i, _ in insts):
            if not any(i == "USER" and a.split(":")[0] not in ("root", "0") for i, a in insts):
                errors.append(f"{dockerfile}: stage {name} runs as root (no non-root USER)")
            if not any(i == "HEALTHCHECK" and "orthoctl" in a and "health" in a for i, a in insts):
                errors.append(f"{dockerfile}: stage {name} has no HEALTHCHECK via `orthoctl health`")
    for name, base, _ in stages:
        if base.startswith("$"):
            continue
        if ":" not in base and "@" not in base and base not in {s[0] for s in stages}:
            errors.append(f"{dockerfile}: stage {name} base {base} has no pinned tag")
    if errors:
        raise CheckError("\n".join(errors))
    print(f"{dockerfile} and {readme}: {len(build_stages)} build stage(s) run the README's "
          f"`{' '.join(f'{k}={v}' for k, v in r_env.items())}{' ' if r_env else ''}./scripts/setup.sh` "
          f"and ship {build_dir}/bin/orthoserve and orthoctl")


def check_dockerfile_args(dockerfile):
    """Every ARG used in a FROM has a default that names a tag or digest (pinned, not latest)."""
    text = pathlib.Path(dockerfile).read_text()
    args = dict(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)", text, re.M))
    errors = []
    for ref in re.findall(r"^FROM\s+(?:--platform=\S+\s+)?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", text, re.M):
        value = args.get(ref)
        if value is None:
            errors.append(f"{dockerfile}: FROM ${ref} has no ARG default")
        elif not re.search(r":[A-Za-z0-9._-]+$|@sha256:[0-9a-f]{64}$", value) or value.endswith(":latest"):
            errors.append(f"{dockerfile}: ARG {ref}={value} is not pinned to a tag or digest")
    if errors:
        raise CheckError("\n".join(errors))
    print(f"{dockerfile}: base images pinned: " + ", ".join(f"{k}={v}" for k, v in args.items() if k.endswith("IMAGE")))



# ---------------------------------------------------------------------------------------------
# PrometheusRule kept in step with the plain rules file


def prometheusrule_for(rules_path, name):
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "orthoserve",
                                              "app.kubernetes.io/part-of": "orthoserve"}},
        "spec": yaml.safe_load(pathlib.Path(rules_path).read_text()),
    }


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks, as a person would."""


_BlockDumper.add_representer(str, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))


def check_prometheusrule(rules_path, rule_path, write):
    header = ("# Generated from deploy/prometheus/orthoserve-rules.yaml by\n"
              "#   .venv-deploy/bin/python tests/deploy/deploy_checks.py prometheusrule --write\n"
              "# scripts/check_deploy.sh fails when the two differ.\n")
    want = header + yaml.dump(prometheusrule_for(rules_path, "orthoserve"), Dumper=_BlockDumper, sort_keys=False,
                                width=110, indent=2)
    p = pathlib.Path(rule_path)
    if write:
        p.write_text(want)
    elif not p.exists() or p.read_text() != want:
        raise CheckError(f"{rule_path} is not the PrometheusRule form of {rules_path}: run "
                         f"`tests/deploy/deploy_checks.py prometheusrule {rules_path} {rule_path} --write`")
    print(f"{rule_path}: same rules as {rules_path}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("metric-names", help="dashboard and rule queries name only scraped metrics")
    p.add_argument("--scrape", required=True)
    p.add_argument("--dashboard", action="append", default=[])
    p.add_argument("--rules", action="append", default=[])
    p = sub.add_parser("dashboard-data", help="every dashboard query and recording rule has data in a Prometheus")
    p.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--dashboard", action="append", default=[])
    p.add_argument("--rules", action="append", default=[])
    p.add_argument("--wait", type=float, default=30, help="seconds to retry queries that have no data yet")
    p = sub.add_parser("prometheus-targets", help="wait until a Prometheus scrapes N targets successfully")
    p.add_argument("--prometheus", required=True)
    p.add_argument("--selector", default="")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--wait", type=float, default=30)
    p = sub.add_parser("dashboard-rules", help="write the dashboard's queries as a rules file for promtool")
    p.add_argument("dashboard")
    p.add_argument("out")
    p = sub.add_parser("rendered", help="consistency of a rendered kustomization")
    p.add_argument("file")
    p = sub.add_parser("pod-env", help="print a pod's environment as the kubelet builds it")
    p.add_argument("file")
    p.add_argument("--statefulset", default="")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--namespace", default="orthoserve")
    p = sub.add_parser("split", help="separate built-in kinds from custom resources (checked here)")
    p.add_argument("file")
    p.add_argument("builtin_out")
    p.add_argument("crd_out")
    p = sub.add_parser("probe-command", help="print an exec probe's command as a shell script")
    p.add_argument("file")
    p.add_argument("--statefulset", default="")
    p.add_argument("--probe", default="readinessProbe")
    p = sub.add_parser("write-npy", help="write a float32 .npy test matrix")
    p.add_argument("path")
    p.add_argument("rows", type=int)
    p.add_argument("cols", type=int)
    p = sub.add_parser("dockerfile-run", help="print a stage's RUN command that contains a string")
    p.add_argument("dockerfile")
    p.add_argument("stage")
    p.add_argument("needle")
    p = sub.add_parser("etcd", help="an etcd example: every fleet elects its coordinator in etcd")
    p.add_argument("file")
    p.add_argument("--members", type=int, default=0, help="the render ships an etcd StatefulSet of this size")
    p.add_argument("--external", action="store_true", help="the render ships no etcd (it runs elsewhere)")
    p = sub.add_parser("statefulsets", help="list the fleet StatefulSets of a render with their replicas")
    p.add_argument("file")
    p = sub.add_parser("dockerfile-readme", help="the Dockerfile builds exactly as the README does")
    p.add_argument("dockerfile")
    p.add_argument("readme")
    p = sub.add_parser("prometheusrule", help="the PrometheusRule carries the same rules as the rules file")
    p.add_argument("rules")
    p.add_argument("prometheusrule")
    p.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "metric-names":
            check_metric_names(a.scrape, a.dashboard, a.rules)
        elif a.cmd == "dashboard-data":
            check_dashboard_data(a.prometheus, a.dashboard, a.rules, a.wait)
        elif a.cmd == "prometheus-targets":
            wait_prometheus_targets(a.prometheus, a.selector, a.count, a.wait)
        elif a.cmd == "dashboard-rules":
            write_dashboard_rules(a.dashboard, a.out)
        elif a.cmd == "rendered":
            check_rendered(a.file)
        elif a.cmd == "pod-env":
            print_pod_env(a.file, a.statefulset, a.index, a.namespace)
        elif a.cmd == "split":
            split_rendered(a.file, a.builtin_out, a.crd_out)
        elif a.cmd == "probe-command":
            print_probe_command(a.file, a.statefulset, a.probe)
        elif a.cmd == "write-npy":
            write_npy(a.path, a.rows, a.cols)
        elif a.cmd == "dockerfile-run":
            print_dockerfile_run(a.dockerfile, a.stage, a.needle)
        elif a.cmd == "etcd":
            check_etcd_example(a.file, a.members, a.external)
        elif a.cmd == "statefulsets":
            list_statefulsets(a.file)
        elif a.cmd == "dockerfile-readme":
            check_dockerfile_args(a.dockerfile)
            check_dockerfile_readme(a.dockerfile, a.readme)
        elif a.cmd == "prometheusrule":
            check_prometheusrule(a.rules, a.prometheusrule, a.write)
    except CheckError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
