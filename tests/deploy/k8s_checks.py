#!/usr/bin/env python3
"""Kubernetes posture checks for deploy/k8s, used by scripts/check_deploy.sh (next to the fleet
consistency checks of deploy_checks.py):

  service-account      every fleet runs under its own ServiceAccount, with no API token mounted
                       and no Role bound to it
  node-spread          the ranks of a fleet are spread over nodes (hostname, maxSkew 1, selecting
                       this fleet's pods only); hard (DoNotSchedule) for GPU fleets
  gpu-nodes            a cuda fleet asks for one nvidia.com/gpu, selects GPU nodes, names the
                       nvidia RuntimeClass and tolerates the nvidia.com/gpu taint
  monitoring-opt-in    base, the overlays and the TLS example render no monitoring.coreos.com
                       object (they apply without the Prometheus Operator); components/monitoring
                       adds exactly one ServiceMonitor per fleet, selecting its headless Service
  world-from-replicas  ORTHOSERVE_WORLD is derived from the StatefulSet's replicas: every
                       kustomization that sets a size carries the replacement, none sets WORLD by
                       hand, and every kustomization rendered with other sizes has WORLD follow
  gpu-driver-docs      the GPU image states the CUDA version it contains and the NVIDIA driver the
                       node needs (Dockerfile labels, docs/operations.md), matching its base image

  k8s_checks.py list                    names of the checks
  k8s_checks.py CHECK [--kubectl PATH]  runs one; exits 1 with what is wrong and where

Needs PyYAML (from .venv-deploy) and kubectl (kustomize); everything else is the standard library.
"""
import argparse
import concurrent.futures
import copy
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import deploy_checks as dc  # noqa: E402

CheckError = dc.CheckError

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
# Every kustomization scripts/check_deploy.sh renders, relative to deploy/k8s.
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu", "examples/cells", "examples/tls", "examples/monitoring",
                  "examples/fleet-tls-cert-manager", "examples/etcd", "examples/etcd-external", "examples/sidecar"]
# Those that must apply on a cluster without the Prometheus Operator's CRDs.
OPERATOR_FREE = ["base", "overlays/cpu", "overlays/gpu", "examples/tls", "examples/etcd", "examples/etcd-external",
                 "examples/sidecar"]
MONITORING_COMPONENT = "components/monitoring"
MONITORING_GROUP = "monitoring.coreos.com"
HOSTNAME = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"

# NVIDIA driver each CUDA toolkit release ships with (Linux x86_64), from NVIDIA's CUDA Toolkit
# release notes ("CUDA Toolkit and Corresponding Driver Versions"). Add a row when bumping
# CUDA_RUNTIME_IMAGE in the Dockerfile.
CUDA_TOOLKIT_DRIVER = {
    "13.0.0": "580.65.06",
    "13.0.1": "580.82.07",
    "13.0.2": "580.95.05",
}
# The oldest driver that runs a CUDA major release's applications (minor version compatibility:
# "CUDA 13.x >= 580"; 580.65.06 is the driver CUDA 13.0 GA ships with).
CUDA_MAJOR_MIN_DRIVER = {"13": "580.65.06", "12": "525.60.13"}
# Labels the GPU image carries (Dockerfile, stage gpu).
LABEL_CUDA = "io.orthoserve.cuda.version"
LABEL_DRIVER_MIN = "io.orthoserve.nvidia-driver.min"
LABEL_DRIVER_RECOMMENDED = "io.orthoserve.nvidia-driver.recommended"


# ---------------------------------------------------------------------------------------------
# Rendering


def find_kubectl(explicit=None):
    for candidate in (explicit, ROOT / ".venv-deploy/bin/kubectl", shutil.which("kubectl")):
        if candidate and pathlib.Path(candidate).is_file():
            return str(candidate)
    raise CheckError("kubectl not found (scripts/check_deploy.sh installs it into .venv-deploy)")


def render(kubectl, path):
    """The objects `kubectl kustomize PATH` renders."""
    p = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        raise CheckError(f"kubectl kustomize {path} failed: {p.stderr.strip()}")
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def render_all(kubectl, k8s_dir, names):
    """{name: objects} for each kustomization NAME under K8S_DIR (rendered in parallel)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(render, kubectl, pathlib.Path(k8s_dir) / name) for name in names}
        return {name: f.result() for name, f in futures.items()}


def statefulsets(objs):
    """The fleets of a render (components/etcd's etcd StatefulSet is none)."""
    return dc.fleet_statefulsets(objs)


def pod_spec(sts):
    return sts["spec"]["template"]["spec"]


def pod_labels(sts):
    return sts["spec"]["template"].get("metadata", {}).get("labels", {})


def backend(objs, sts):
    return dc.configmap_env(objs, dc.container(sts), f"StatefulSet {sts['metadata']['name']}").get(
        "ORTHOSERVE_BACKEND", "cpu")


def selector_matches(selector, labels):
    """Kubernetes LabelSelector semantics: no selector matches nothing, an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {"In": lambda: labels.get(key) in values,
              "NotIn": lambda: labels.get(key) not in values,
              "Exists": lambda: key in labels,
              "DoesNotExist": lambda: key not in labels}.get(op, lambda: False)()
        if not ok:
            return False
    return True


def each_fleet(renders, check):
    """Runs check(objs, sts) for every StatefulSet of every render; returns (errors, fleets seen)."""
    errors, seen = [], []
    for name, objs in renders.items():
        for sts in statefulsets(objs):
            seen.append(f"{name}:{sts['metadata']['name']}")
            errors += [f"{name}: StatefulSet {sts['metadata']['name']}: {e}" for e in check(objs, sts)]
    return errors, seen


# ---------------------------------------------------------------------------------------------
# ServiceAccount


def check_service_account(objs, sts):
    """A dedicated ServiceAccount, no token in the pod (pod and account say so), nothing bound."""
    errors = []
    pod = pod_spec(sts)
    name = pod.get("serviceAccountName") or pod.get("serviceAccount")
    if not name or name == "default":
        errors.append(f"runs as ServiceAccount {name or 'default'!r}: it needs its own (serviceAccountName)")
    if pod.get("automountServiceAccountToken") is not False:
        errors.append("the pod spec must set automountServiceAccountToken: false (the server never calls the API)")
    for v in pod.get("volumes", []):
        for src in v.get("projected", {}).get("sources", []):
            if "serviceAccountToken" in src:
                errors.append(f"volume {v['name']} projects a ServiceAccount token into the pod")
    if name and name != "default":
        accounts = [o for o in objs if o.get("kind") == "ServiceAccount" and o["metadata"]["name"] == name]
        if not accounts:
            errors.append(f"ServiceAccount {name} is not in the render")
        elif accounts[0].get("automountServiceAccountToken") is not False:
            errors.append(f"ServiceAccount {name} must set automountServiceAccountToken: false")
        for b in objs:
            if b.get("kind") in ("RoleBinding", "ClusterRoleBinding") and any(
                    s.get("kind") == "ServiceAccount" and s.get("name") == name for s in b.get("subjects", [])):
                errors.append(f"{b['kind']} {b['metadata']['name']} grants ServiceAccount {name} API access")
    return errors


# ---------------------------------------------------------------------------------------------
# Spread over nodes


def check_node_spread(objs, sts):
    """The ranks of this fleet spread over nodes: a topology spread constraint over hostnames with
    maxSkew 1 (or a podAntiAffinity term on hostname) whose selector takes this fleet's pods and no
    other fleet's. A cuda fleet needs it hard (DoNotSchedule, or required anti-affinity)."""
    pod = pod_spec(sts)
    own = pod_labels(sts)
    others = [pod_labels(o) for o in statefulsets(objs) if o is not sts]
    cuda = backend(objs, sts) == "cuda"
    found, errors = [], []

    def judge(kind, selector, hard):
        if not selector_matches(selector, own):
            errors.append(f"{kind} on {HOSTNAME}: its labelSelector does not select the fleet's own pods "
                          "(it spreads nothing)")
        elif any(selector_matches(selector, o) for o in others):
            errors.append(f"{kind} on {HOSTNAME}: its labelSelector also selects another fleet's pods "
                          "(each fleet must spread on its own)")
        else:
            found.append(hard)

    for c in pod.get("topologySpreadConstraints") or []:
        if c.get("topologyKey") != HOSTNAME:
            continue
        if c.get("maxSkew") != 1:
            errors.append(f"topologySpreadConstraint on {HOSTNAME} has maxSkew {c.get('maxSkew')!r}, want 1")
            continue
        judge("topologySpreadConstraint", c.get("labelSelector"), c.get("whenUnsatisfiable") == "DoNotSchedule")
    anti = (pod.get("affinity") or {}).get("podAntiAffinity") or {}
    for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        if term.get("topologyKey") == HOSTNAME:
            judge("required podAntiAffinity", term.get("labelSelector"), True)
    for weighted in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        term = weighted.get("podAffinityTerm", {})
        if term.get("topologyKey") == HOSTNAME:
            judge("preferred podAntiAffinity", term.get("labelSelector"), False)
    if not found and not errors:
        errors.append(f"no topologySpreadConstraint (maxSkew 1) or podAntiAffinity on {HOSTNAME}: two ranks of "
                      "the fleet may land on one node")
    if found and cuda and not any(found):
        errors.append(f"backend cuda: the spread over {HOSTNAME} must be hard (whenUnsatisfiable: DoNotSchedule "
                      "or required podAntiAffinity), one GPU rank per node")
    return errors


# ---------------------------------------------------------------------------------------------
# GPU nodes


def check_gpu_nodes(objs, sts):
    """A cuda fleet: one GPU per rank, on GPU nodes, under the nvidia runtime, tolerating the taint."""
    if backend(objs, sts) != "cuda":
        return []
    pod = pod_spec(sts)
    errors = []
    limits = dc.container(sts).get("resources", {}).get("limits", {})
    if str(limits.get(GPU_RESOURCE)) != "1":
        errors.append(f"backend cuda needs {GPU_RESOURCE}: 1 in the container's limits, "
                      f"not {limits.get(GPU_RESOURCE)!r}")
    required_affinity = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not pod.get("nodeSelector") and not required_affinity:
        errors.append("backend cuda needs a nodeSelector (e.g. nvidia.com/gpu.present: \"true\") or a required "
                      "nodeAffinity for GPU nodes")
    if not pod.get("runtimeClassName"):
        errors.append("backend cuda needs runtimeClassName (nvidia: the runtime that injects the driver)")
    if not any(t.get("key") == GPU_RESOURCE and t.get("effect") in (None, "", "NoSchedule")
               and t.get("operator", "Equal") in ("Exists", "Equal") for t in pod.get("tolerations") or []):
        errors.append(f"backend cuda needs a toleration for the {GPU_RESOURCE} NoSchedule taint of GPU nodes")
    return errors


# ---------------------------------------------------------------------------------------------
# Prometheus Operator objects only where opted in


def operator_objects(objs):
    return [o for o in objs if str(o.get("apiVersion", "")).split("/")[0] == MONITORING_GROUP]


def check_operator_free(objs):
    return [f"{o['kind']} {o['metadata'].get('name')} ({o['apiVersion']}) needs the Prometheus Operator's CRDs"
            for o in operator_objects(objs)]


def check_monitored(objs, sts):
    """Exactly one ServiceMonitor selects the fleet's headless Service and scrapes its metrics port."""
    svc_name = sts["spec"].get("serviceName")
    svcs = [o for o in objs if o.get("kind") == "Service" and o["metadata"]["name"] == svc_name]
    if not svcs:
        return [f"headless Service {svc_name!r} is not in the render"]
    svc = svcs[0]
    mons = [m for m in objs if m.get("kind") == "ServiceMonitor"
            and selector_matches(m.get("spec", {}).get("selector"), svc["metadata"].get("labels", {}))]
    if len(mons) != 1:
        return [f"{len(mons)} ServiceMonitors select Service {svc_name}, want 1"]
    ports = {p.get("name") for p in svc["spec"].get("ports", [])}
    eps = mons[0]["spec"].get("endpoints", [])
    if not any(ep.get("port") in ports for ep in eps):
        return [f"ServiceMonitor {mons[0]['metadata']['name']} scrapes none of Service {svc_name}'s "
                f"ports {sorted(ports)}"]
    return []


def monitoring_component_render(kubectl, k8s_dir, base="overlays/cpu"):
    """Renders BASE with components/monitoring added, as a kustomization opting in would."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "k8s"
        shutil.copytree(k8s_dir, tree)
        opt_in = tree / "_checks/monitoring"
        opt_in.mkdir(parents=True)
        (opt_in / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [f"../../{base}"], "components": [f"../../{MONITORING_COMPONENT}"]}))
        return render(kubectl, opt_in)


def check_monitoring_opt_in(kubectl, k8s_dir=K8S):
    errors, lines = [], []
    for name, objs in render_all(kubectl, k8s_dir, OPERATOR_FREE).items():
        bad = check_operator_free(objs)
        errors += [f"{name}: {e} (move it to {MONITORING_COMPONENT}, which kustomizations opt into)" for e in bad]
        if not bad:
            lines.append(f"{name}: no {MONITORING_GROUP} object")
    opted = {}
    makers = ((f"overlays/cpu + {MONITORING_COMPONENT}", lambda: monitoring_component_render(kubectl, k8s_dir)),
              ("examples/cells", lambda: render(kubectl, pathlib.Path(k8s_dir) / "examples/cells")))
    for name, make in makers:
        try:
            opted[name] = make()
        except CheckError as e:
            errors.append(f"{name}: {e}")
    for name, objs in opted.items():
        kinds = sorted({o["kind"] for o in operator_objects(objs)})
        if not kinds:
            errors.append(f"{name}: renders no {MONITORING_GROUP} object")
        errs, seen = each_fleet({name: objs}, check_monitored)
        errors += errs
        if not errs and kinds:
            lines.append(f"{name}: {', '.join(kinds)}; each of {len(seen)} fleet(s) scraped by one ServiceMonitor")
    if errors:
        raise CheckError("\n".join(errors))
    print("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# ORTHOSERVE_WORLD from replicas


def is_world_replacement(r):
    src = r.get("source", {})
    return (src.get("kind") == "StatefulSet" and src.get("fieldPath") == "spec.replicas"
            and any(t.get("select", {}).get("kind") == "ConfigMap"
                    and "data.ORTHOSERVE_WORLD" in t.get("fieldPaths", []) for t in r.get("targets", [])))


def kustomization_files(k8s_dir):
    return sorted(p for p in pathlib.Path(k8s_dir).rglob("kustomization.yaml") if "_checks" not in p.parts)


def check_world_sources(k8s_dir=K8S):
    """Statically: no hand-set ORTHOSERVE_WORLD; every kustomization that sets a size has the replacement."""
    k8s_dir = pathlib.Path(k8s_dir)
    errors, sized = [], []
    for f in kustomization_files(k8s_dir):
        doc = yaml.safe_load(f.read_text()) or {}
        where = f.relative_to(k8s_dir)
        has_replacement = any(is_world_replacement(r) for r in doc.get("replacements") or [])
        if doc.get("replicas") or f.parent == k8s_dir / "base":
            sized.append(str(where.parent))
            if not has_replacement:
                errors.append(f"{where} sets the fleet's size but has no replacement of ConfigMap "
                              "data.ORTHOSERVE_WORLD from StatefulSet spec.replicas (copy base's)")
        for g in doc.get("configMapGenerator") or []:
            for lit in g.get("literals") or []:
                if str(lit).startswith("ORTHOSERVE_WORLD="):
                    errors.append(f"{where}: sets {lit} by hand; it is derived from replicas")
            for env in g.get("envs") or []:
                for line in (f.parent / env).read_text().splitlines():
                    m = re.match(r"ORTHOSERVE_WORLD=(.*)", line.strip())
                    if m and re.fullmatch(r"\d+", m.group(1)):
                        errors.append(f"{f.parent.relative_to(k8s_dir) / env}: sets ORTHOSERVE_WORLD={m.group(1)} by "
                                      "hand; it is derived from replicas (leave the placeholder)")
    if errors:
        raise CheckError("\n".join(errors))
    return sized


def world_of(objs, sts):
    return dc.configmap_env(objs, dc.container(sts), f"StatefulSet {sts['metadata']['name']}").get("ORTHOSERVE_WORLD")


def config_name(sts):
    return [s["configMapRef"]["name"] for s in dc.container(sts).get("envFrom", []) if "configMapRef" in s]


def check_world_follows(kubectl, k8s_dir=K8S, bump=3, new_size=5):
    """Renders every kustomization with other sizes and checks that ORTHOSERVE_WORLD follows:
    1. in a copy of the tree, every size is raised, each by another amount (base's replicas by
       BUMP, the i-th `replicas:` count by BUMP + 1 + i, so that a kustomization whose size happens
       to equal the one below it cannot hide a missing replacement): each fleet's replicas must
       change, WORLD must equal them, and the ConfigMap's name (its hash) must change, so that
       the pods roll;
    2. a kustomization on top of each single-fleet one that sets `replicas:` to NEW_SIZE with base's
       replacement block (what docs/operations.md tells an overlay to do) gets WORLD = NEW_SIZE."""
    k8s_dir = pathlib.Path(k8s_dir)
    errors, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "k8s"
        shutil.copytree(k8s_dir, tree)
        targets = [k for k in KUSTOMIZATIONS if (tree / k).is_dir()]
        before = {k: objs for k, objs in render_all(kubectl, tree, targets).items() if statefulsets(objs)}
        for name, objs in before.items():
            for sts in statefulsets(objs):
                if world_of(objs, sts) != str(sts["spec"].get("replicas", 1)):
                    errors.append(f"{name}: StatefulSet {sts['metadata']['name']}: ORTHOSERVE_WORLD "
                                  f"{world_of(objs, sts)!r} differs from replicas {sts['spec'].get('replicas', 1)}")
        # 1. Every size in the tree raised, each by another amount.
        sts_file = tree / "base/statefulset.yaml"
        doc = yaml.safe_load(sts_file.read_text())
        doc["spec"]["replicas"] = doc["spec"].get("replicas", 1) + bump
        sts_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        step = bump
        for f in kustomization_files(tree):
            doc = yaml.safe_load(f.read_text()) or {}
            if doc.get("replicas"):
                for r in doc["replicas"]:
                    step += 1
                    r["count"] += step
                f.write_text(yaml.safe_dump(doc, sort_keys=False))
        after = render_all(kubectl, tree, list(before))
        for name, objs in after.items():
            old = {s["metadata"]["name"]: s for s in statefulsets(before[name])}
            for sts in statefulsets(objs):
                sname = sts["metadata"]["name"]
                was = old.get(sname)
                replicas, world = sts["spec"].get("replicas", 1), world_of(objs, sts)
                where = f"{name} with other sizes: StatefulSet {sname}"
                if was is None:
                    errors.append(f"{where}: not in the unchanged render")
                    continue
                if replicas == was["spec"].get("replicas", 1):
                    errors.append(f"{where}: replicas {replicas} did not change with every size raised")
                if world != str(replicas):
                    errors.append(f"{where}: ORTHOSERVE_WORLD stays {world!r} while replicas is {replicas} (a "
                                  "kustomization that sets the size lacks the replacement from spec.replicas)")
                elif config_name(sts) == config_name(was):
                    errors.append(f"{where}: ConfigMap name {config_name(sts)} unchanged: the pods would not roll")
                else:
                    lines.append(f"{name} with other sizes: {sname} replicas {replicas}, ORTHOSERVE_WORLD {world}, "
                                 f"ConfigMap {config_name(sts)[0]}")
        # 2. An overlay of its own that sets the size, on top of each single-fleet kustomization of
        #    the unchanged tree.
        tree = pathlib.Path(tmp) / "unchanged"
        shutil.copytree(k8s_dir, tree)
        base_doc = yaml.safe_load((tree / "base/kustomization.yaml").read_text())
        block = [r for r in base_doc.get("replacements") or [] if is_world_replacement(r)]
        for name, objs in before.items():
            stss = statefulsets(objs)
            if len(stss) != 1:
                continue
            overlay = tree / "_checks" / ("size-" + name.replace("/", "-"))
            overlay.mkdir(parents=True)
            # A render with another StatefulSet (components/etcd's) needs the source named: the
            # fleet's (docs/operations.md, "Elected coordinator (etcd)").
            named = len([o for o in objs if o.get("kind") == "StatefulSet"]) > 1
            replacements = copy.deepcopy(block)
            if named:
                for r in replacements:
                    r["source"]["name"] = stss[0]["metadata"]["name"]
            (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [f"../../{name}"],
                "replicas": [{"name": stss[0]["metadata"]["name"], "count": new_size}],
                "replacements": replacements}, sort_keys=False))
            objs = render(kubectl, overlay)
            sts = statefulsets(objs)[0]
            where = (f"{name} + an overlay setting replicas {new_size} with base's replacement"
                     + (f" (source named {stss[0]['metadata']['name']})" if named else ""))
            if sts["spec"].get("replicas") != new_size or world_of(objs, sts) != str(new_size):
                errors.append(f"{where}: replicas {sts['spec'].get('replicas')}, ORTHOSERVE_WORLD "
                              f"{world_of(objs, sts)!r}")
            else:
                lines.append(f"{where}: ORTHOSERVE_WORLD {new_size}")
    if errors:
        raise CheckError("\n".join(errors))
    print("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# The GPU image's driver requirement


def stage_labels(insts):
    labels = {}
    for inst, arg in insts:
        if inst == "LABEL":
            for word in shlex.split(arg):
                k, _, v = word.partition("=")
                labels[k] = v
    return labels


def check_gpu_driver_docs(dockerfile=ROOT / "Dockerfile", docs=ROOT / "docs/operations.md"):
    text = pathlib.Path(dockerfile).read_text()
    args = dict(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)", text, re.M))
    errors = []
    versions = {}
    for arg in ("CUDA_DEVEL_IMAGE", "CUDA_RUNTIME_IMAGE"):
        m = re.match(r"nvidia/cuda:(\d+\.\d+\.\d+)-", args.get(arg, ""))
        if not m:
            errors.append(f"{dockerfile}: ARG {arg}={args.get(arg)!r} is not an nvidia/cuda:X.Y.Z-... image")
        else:
            versions[arg] = m.group(1)
    if errors:
        raise CheckError("\n".join(errors))
    cuda = versions["CUDA_RUNTIME_IMAGE"]
    if versions["CUDA_DEVEL_IMAGE"] != cuda:
        errors.append(f"{dockerfile}: built with CUDA {versions['CUDA_DEVEL_IMAGE']}, run on {cuda}")
    tested = CUDA_TOOLKIT_DRIVER.get(cuda)
    minimum = CUDA_MAJOR_MIN_DRIVER.get(cuda.split(".")[0])
    if tested is None or minimum is None:
        raise CheckError(f"{dockerfile}: CUDA {cuda} is not in tests/deploy/k8s_checks.py's driver tables: add the "
                         "driver it ships with (CUDA_TOOLKIT_DRIVER) and its major's minimum (CUDA_MAJOR_MIN_DRIVER) "
                         "from NVIDIA's CUDA Toolkit release notes, then update the Dockerfile's labels and "
                         "docs/operations.md")
    stages = {name: insts for name, _, insts in dc.dockerfile_stages(dockerfile)}
    labels = stage_labels(stages.get("gpu", []))
    want = {LABEL_CUDA: cuda, LABEL_DRIVER_MIN: minimum, LABEL_DRIVER_RECOMMENDED: tested}
    for k, v in want.items():
        if labels.get(k) != v:
            errors.append(f"{dockerfile}: stage gpu: LABEL {k}={labels.get(k)!r}, want {v!r} (CUDA {cuda})")
    doc = pathlib.Path(docs).read_text()
    for needle, what in ((cuda, "the image's CUDA version"), (minimum, "the minimum driver"),
                         (tested, "the driver CUDA ships with")):
        if needle not in doc:
            errors.append(f"{docs}: does not state {what}, {needle}")
    if errors:
        raise CheckError("\n".join(errors))
    print(f"{dockerfile}: gpu image: CUDA {cuda}, NVIDIA driver >= {minimum} (recommended >= {tested}); "
          f"labelled and in {pathlib.Path(docs).name}")


# ---------------------------------------------------------------------------------------------


def run_fleet_check(kubectl, check, k8s_dir=K8S, need_cuda=False):
    renders = render_all(kubectl, k8s_dir, [k for k in KUSTOMIZATIONS if (pathlib.Path(k8s_dir) / k).is_dir()])
    errors, seen = each_fleet(renders, check)
    cuda = [f"{name}:{s['metadata']['name']}" for name, objs in renders.items() for s in statefulsets(objs)
            if backend(objs, s) == "cuda"]
    if need_cuda and not cuda:
        errors.append("no render has a fleet with ORTHOSERVE_BACKEND=cuda: the GPU overlay went unchecked")
    if errors:
        raise CheckError("\n".join(errors))
    print(f"{len(seen)} fleets pass: {', '.join(seen)} (backend cuda: {', '.join(cuda) or 'none'})")


CHECKS = {
    "service-account": lambda a: run_fleet_check(a.kubectl, check_service_account),
    "node-spread": lambda a: run_fleet_check(a.kubectl, check_node_spread),
    "gpu-nodes": lambda a: run_fleet_check(a.kubectl, check_gpu_nodes, need_cuda=True),
    "monitoring-opt-in": lambda a: check_monitoring_opt_in(a.kubectl),
    "world-from-replicas": lambda a: (print("sizes set in: " + ", ".join(check_world_sources())),
                                      check_world_follows(a.kubectl)),
    "gpu-driver-docs": lambda a: check_gpu_driver_docs(),
}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["list"] + list(CHECKS))
    ap.add_argument("--kubectl", default=None, help="kubectl with kustomize (default: .venv-deploy's, then PATH)")
    a = ap.parse_args(argv)
    if a.check == "list":
        print("\n".join(CHECKS))
        return 0
    try:
        a.kubectl = find_kubectl(a.kubectl)
        CHECKS[a.check](a)
    except CheckError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
