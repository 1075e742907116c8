#!/usr/bin/env python3
"""Checks of the same-host sidecar layout (deploy/k8s/examples/sidecar; docs/operations.md, "Same-host data path
(shared memory)"), used by scripts/check_deploy.sh:

  sidecar_checks.py check RENDER... [--require RENDER]
      Every pod (of a Pod, Job, CronJob, Deployment, StatefulSet, DaemonSet or ReplicaSet) of the renders whose
      orthoserve container takes regions (--shm-socket / ORTHOSERVE_SHM_SOCKET) must let its trainers use them:
        - the socket path is absolute and lies on a volume of the orthoserve container that is an emptyDir with
          medium Memory and a sizeLimit;
        - every other container of the pod (the trainers) mounts that volume at the same path (the path the server
          reports in GetServerInfo is the path the trainer opens);
        - the trainers' uid (runAsUser, the container's or the pod's) is set and is one the server accepts
          (--shm-peer-uids, or the server's own uid when that is not set), and the server's uid is set;
        - shareProcessNamespace is not on (nothing needs it; it would let the containers see and signal each
          other), and the public port listens on loopback only (the pod's containers are its only clients);
        - a trainer's ORTHOSERVE_ADDRESS, when set, is that loopback port.
      With --require, that render must have at least one such pod (so the example cannot lose its sidecar
      unnoticed).
  sidecar_checks.py env RENDER --container NAME
      The environment of container NAME of the render's sidecar pod (ConfigMaps, then env), one KEY=VALUE a line,
      then "#ARGS <args>": what the live check starts the server (or runs the trainer) with.

Needs PyYAML (from .venv-deploy); exits 1 with what is wrong and where.
"""
import argparse
import pathlib
import posixpath
import shlex
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import deploy_checks as dc  # noqa: E402

CheckError = dc.CheckError

SERVER = "orthoserve"  # The server container's name.
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def pod_templates(objs):
    """(where, pod spec) of every workload of a render."""
    for o in objs:
        kind, name = o.get("kind"), o.get("metadata", {}).get("name")
        spec = o.get("spec") or {}
        if kind == "Pod":
            yield f"Pod {name}", spec
        elif kind == "CronJob":
            yield f"CronJob {name}", spec["jobTemplate"]["spec"]["template"]["spec"]
        elif kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
            yield f"{kind} {name}", spec["template"]["spec"]


def all_containers(pod):
    return list(pod.get("initContainers") or []) + list(pod.get("containers") or [])


def flag_env(args):
    """ORTHOSERVE_* names of the --flags in a container's args (--x=v or --x v)."""
    out, i = {}, 0
    while i < len(args):
        arg = str(args[i])
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq and i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                value, i = str(args[i + 1]), i + 1
            out["ORTHOSERVE_" + key.replace("-", "_").upper()] = value
        i += 1
    return out


def container_env(objs, c, where):
    """A container's environment as the kubelet builds it from envFrom ConfigMaps and literal env values."""
    env = dc.configmap_env(objs, c, where)
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return env


def server_config(objs, c, where):
    """The server's settings: its environment, overridden by its command-line flags."""
    env = container_env(objs, c, where)
    env.update(flag_env(list(c.get("command") or [])[1:] + list(c.get("args") or [])))
    return env


def sidecars(objs):
    """(where, pod, server container, its settings) of every pod whose orthoserve container takes regions."""
    for where, pod in pod_templates(objs):
        for c in all_containers(pod):
            if c.get("name") != SERVER:
                continue
            config = server_config(objs, c, where)
            if config.get("ORTHOSERVE_SHM_SOCKET"):
                yield where, pod, c, config


def uid_of(pod, c):
    uid = (c.get("securityContext") or {}).get("runAsUser")
    return uid if uid is not None else (pod.get("securityContext") or {}).get("runAsUser")


def mount_holding(c, path):
    """The volumeMount of `c` whose mountPath holds `path` (the deepest), or None."""
    best = None
    for m in c.get("volumeMounts") or []:
        root = posixpath.normpath(m["mountPath"])
        if posixpath.commonpath([root, path]) == root and (best is None or len(root) > len(best["mountPath"])):
            best = m
    return best


def split_host_port(address):
    host, _, port = str(address).rpartition(":")
    return host, port


def check_sidecar(objs, where, pod, server, config):
    """What is wrong with one sidecar pod (see the module's docstring), as messages."""
    errors = []
    socket = config["ORTHOSERVE_SHM_SOCKET"]
    trainers = [c for c in pod.get("containers") or [] if c is not server]
    if not trainers:
        errors.append("no other container shares the pod with the orthoserve container: nothing can use its "
                      "regions (a sidecar runs next to the trainer)")
    if not posixpath.isabs(socket):
        errors.append(f"--shm-socket {socket!r} is not an absolute path")
        return errors
    socket = posixpath.normpath(socket)
    mount = mount_holding(server, socket)
    if mount is None:
        errors.append(f"--shm-socket {socket} is on no volume of the orthoserve container: the trainer cannot "
                      "reach it (mount an emptyDir with medium Memory at its folder in both containers)")
    else:
        volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mount["name"]), None)
        empty_dir = (volume or {}).get("emptyDir")
        if empty_dir is None:
            errors.append(f"volume {mount['name']} (the socket's, at {mount['mountPath']}) is not an emptyDir: "
                          "it must be the pod's own, gone with the pod")
        else:
            if empty_dir.get("medium") != "Memory":
                errors.append(f"emptyDir {mount['name']} (the socket's) has medium {empty_dir.get('medium')!r}, "
                              "want Memory (nothing of it on the node's disk)")
            if not empty_dir.get("sizeLimit"):
                errors.append(f"emptyDir {mount['name']} (the socket's) has no sizeLimit (it holds one socket; "
                              "every emptyDir is bounded)")
        for t in trainers:
            theirs = [m for m in t.get("volumeMounts") or [] if m.get("name") == mount["name"]]
            if not any(posixpath.normpath(m["mountPath"]) == posixpath.normpath(mount["mountPath"])
                       for m in theirs):
                at = ", ".join(m["mountPath"] for m in theirs) or "nowhere"
                errors.append(f"container {t['name']} mounts volume {mount['name']} at {at}, not at "
                              f"{mount['mountPath']} as the orthoserve container does: the socket path the server "
                              f"reports ({socket}) does not exist for it")
    server_uid = uid_of(pod, server)
    if server_uid is None:
        errors.append("the orthoserve container's uid is not set (runAsUser): the trainer's cannot be shown to match")
    peers_text = config.get("ORTHOSERVE_SHM_PEER_UIDS", "")
    try:
        peers = [int(u) for u in peers_text.split(",") if u.strip()] or ([server_uid] if server_uid is not None
                                                                         else [])
    except ValueError:
        errors.append(f"--shm-peer-uids {peers_text!r} is not a comma-separated list of uids")
        peers = []
    for t in trainers:
        uid = uid_of(pod, t)
        if uid is None:
            errors.append(f"container {t['name']}'s uid is not set (runAsUser): the server checks it (SO_PEERCRED)")
        elif uid not in peers:
            errors.append(f"container {t['name']} runs as uid {uid}, which the server refuses (it accepts "
                          f"{peers or 'no uid'}: --shm-peer-uids {peers_text!r}, else its own uid {server_uid}); "
                          "give both the same runAsUser")
    if pod.get("shareProcessNamespace"):
        errors.append("shareProcessNamespace is on: regions do not need it (the memfd is passed over the socket), "
                      "and it lets the containers see and signal each other's processes")
    listen = config.get("ORTHOSERVE_LISTEN", "")
    host, port = split_host_port(listen)
    if host not in LOOPBACK:
        errors.append(f"the orthoserve container listens on {listen!r}: a sidecar's public port belongs on "
                      "loopback (127.0.0.1:PORT), where only the pod's containers reach it")
    for t in trainers:
        address = container_env(objs, t, where).get("ORTHOSERVE_ADDRESS")
        if address is not None and (split_host_port(address)[0] not in LOOPBACK or split_host_port(address)[1] != port):
            errors.append(f"container {t['name']} has ORTHOSERVE_ADDRESS={address}, not the sidecar's loopback port "
                          f"{port}")
    return errors


def check_renders(paths, required):
    """Checks every sidecar of the renders at `paths`; `required` renders must have one. Prints a line each."""
    errors, lines = [], []
    for path in dict.fromkeys([*paths, *required]):
        found = 0
        objs = dc.load_objects(path)
        for where, pod, server, config in sidecars(objs):
            found += 1
            problems = check_sidecar(objs, where, pod, server, config)
            errors += [f"{path}: {where}: {e}" for e in problems]
            if not problems:
                trainers = [c["name"] for c in pod.get("containers") or [] if c is not server]
                lines.append(f"{path}: {where}: --shm-socket {config['ORTHOSERVE_SHM_SOCKET']} on a memory emptyDir "
                             f"that {', '.join(trainers)} mount(s) at the same path, as uids the server accepts")
        if path in required and not found:
            errors.append(f"{path}: no pod with an orthoserve container that takes regions (--shm-socket): the "
                          "sidecar example lost its sidecar")
    if errors:
        raise CheckError("\n".join(errors))
    print("\n".join(lines) or "no sidecar pods")


def print_env(path, name):
    objs = dc.load_objects(path)
    for where, pod, server, _ in sidecars(objs):
        for c in all_containers(pod):
            if c.get("name") == name:
                env = container_env(objs, c, where)
                for k, v in sorted(env.items()):
                    print(f"{k}={v}")
                print("#ARGS " + shlex.join(list(c.get("args") or [])))
                return
    raise CheckError(f"{path}: no container {name!r} in a sidecar pod")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check", help="every sidecar pod of the renders lets its trainers use regions")
    p.add_argument("files", nargs="*")
    p.add_argument("--require", action="append", default=[], help="a render that must have a sidecar pod")
    p = sub.add_parser("env", help="a sidecar pod's container environment and args")
    p.add_argument("file")
    p.add_argument("--container", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "check":
            check_renders(a.files, a.require)
        else:
            print_env(a.file, a.container)
    except CheckError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
