#!/usr/bin/env python3
"""Tests for tests/deploy/sidecar_checks.py: the check passes on deploy/k8s/examples/sidecar and fails on renders
that lose what the shared-memory sidecar layout needs (the memory emptyDir and its sizeLimit, the shared mount
path, matching uids, loopback only, no shared process namespace). Run by scripts/check_deploy.sh with the
.venv-deploy Python (PyYAML); KUBECTL names kubectl (default: .venv-deploy's, then PATH).
"""
import copy
import io
import os
import pathlib
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import k8s_checks as kc  # noqa: E402
import sidecar_checks as sc  # noqa: E402

KUBECTL = kc.find_kubectl(os.environ.get("KUBECTL"))
EXAMPLE = "examples/sidecar"
_renders = {}


def rendered(name=EXAMPLE):
    if name not in _renders:
        _renders[name] = kc.render(KUBECTL, kc.K8S / name)
    return copy.deepcopy(_renders[name])


def pod(objs):
    return next(o for o in objs if o["kind"] == "Job")["spec"]["template"]["spec"]


def named(items, name):
    return next(c for c in items if c["name"] == name)


def server(objs):
    return named(pod(objs)["initContainers"], "orthoserve")


def trainer(objs):
    return named(pod(objs)["containers"], "trainer")


def config_map(objs):
    return next(o for o in objs if o["kind"] == "ConfigMap")["data"]


def problems(objs):
    found = list(sc.sidecars(objs))
    if not found:
        return "no sidecar"
    return "\n".join(e for where, p, s, config in found for e in sc.check_sidecar(objs, where, p, s, config))


class SidecarTest(unittest.TestCase):
    def test_the_example_passes(self):
        objs = rendered()
        self.assertEqual(problems(objs), "")
        self.assertEqual(config_map(objs)["ORTHOSERVE_SHM_SOCKET"], "/run/orthoserve/shm.sock")
        self.assertEqual(named(pod(objs)["volumes"], "orthoserve-socket")["emptyDir"]["medium"], "Memory")
        self.assertEqual(server(objs)["restartPolicy"], "Always")  # A native sidecar.

    def volume(self, objs):
        return named(pod(objs)["volumes"], "orthoserve-socket")

    def test_a_socket_volume_on_disk_or_unbounded_fails(self):
        objs = rendered()
        del self.volume(objs)["emptyDir"]["medium"]
        self.assertRegex(problems(objs), "emptyDir orthoserve-socket .* has medium None, want Memory")
        objs = rendered()
        del self.volume(objs)["emptyDir"]["sizeLimit"]
        self.assertRegex(problems(objs), "emptyDir orthoserve-socket .* has no sizeLimit")
        objs = rendered()
        self.volume(objs).pop("emptyDir")
        self.volume(objs)["hostPath"] = {"path": "/run/orthoserve"}
        self.assertRegex(problems(objs), "volume orthoserve-socket .* is not an emptyDir")

    def test_uids_that_do_not_match_fail(self):
        objs = rendered()
        trainer(objs)["securityContext"]["runAsUser"] = 10002
        self.assertRegex(problems(objs), r"container trainer runs as uid 10002, which the server refuses .*\[10001\]")
        objs = rendered()
        config_map(objs)["ORTHOSERVE_SHM_PEER_UIDS"] = "10002"
        self.assertRegex(problems(objs), "container trainer runs as uid 10001, which the server refuses")
        objs = rendered()
        del config_map(objs)["ORTHOSERVE_SHM_PEER_UIDS"]  # The server's own uid: the same, so accepted.
        self.assertEqual(problems(objs), "")
        server(objs)["securityContext"]["runAsUser"] = 10003
        self.assertRegex(problems(objs), r"runs as uid 10001, which the server refuses \(it accepts \[10003\]")
        objs = rendered()
        del pod(objs)["securityContext"]["runAsUser"]
        self.assertRegex(problems(objs), r"(?s)orthoserve container's uid is not set.*container trainer's uid is not "
                                         "set")
        objs = rendered()
        config_map(objs)["ORTHOSERVE_SHM_PEER_UIDS"] = "trainer"
        self.assertRegex(problems(objs), "is not a comma-separated list of uids")

    def test_a_socket_the_trainer_cannot_reach_fails(self):
        objs = rendered()
        named(trainer(objs)["volumeMounts"], "orthoserve-socket")["mountPath"] = "/var/run/orthoserve"
        self.assertRegex(problems(objs), "container trainer mounts volume orthoserve-socket at /var/run/orthoserve, "
                                         "not at /run/orthoserve")
        objs = rendered()
        trainer(objs)["volumeMounts"] = []
        self.assertRegex(problems(objs), "mounts volume orthoserve-socket at nowhere")
        objs = rendered()
        config_map(objs)["ORTHOSERVE_SHM_SOCKET"] = "/var/lib/orthoserve/shm.sock"
        self.assertRegex(problems(objs), "is on no volume of the orthoserve container")
        objs = rendered()
        config_map(objs)["ORTHOSERVE_SHM_SOCKET"] = "shm.sock"
        self.assertRegex(problems(objs), "is not an absolute path")
        # A flag overrides the environment.
        objs = rendered()
        server(objs)["args"] = ["--shm-socket", "/tmp/shm.sock"]
        self.assertRegex(problems(objs), "(?s)emptyDir tmp .*has medium None.*container trainer mounts volume tmp at "
                                         "nowhere")
        objs = rendered()
        pod(objs)["containers"] = []
        self.assertRegex(problems(objs), "no other container shares the pod")

    def test_isolation_fails_when_widened(self):
        objs = rendered()
        pod(objs)["shareProcessNamespace"] = True
        self.assertRegex(problems(objs), "shareProcessNamespace is on")
        objs = rendered()
        config_map(objs)["ORTHOSERVE_LISTEN"] = "0.0.0.0:50051"
        self.assertRegex(problems(objs), "listens on '0.0.0.0:50051': a sidecar's public port belongs on loopback")
        objs = rendered()
        named(trainer(objs)["env"], "ORTHOSERVE_ADDRESS")["value"] = "127.0.0.1:50052"
        self.assertRegex(problems(objs), "ORTHOSERVE_ADDRESS=127.0.0.1:50052, not the sidecar's loopback port 50051")

    def test_the_cli_requires_a_sidecar_and_prints_environments(self):
        with tempfile.TemporaryDirectory() as tmp:
            good, plain = pathlib.Path(tmp) / "sidecar.yaml", pathlib.Path(tmp) / "cpu.yaml"
            good.write_text(yaml.safe_dump_all(rendered()))
            plain.write_text(yaml.safe_dump_all(rendered("overlays/cpu")))
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(sc.main(["check", str(plain), "--require", str(good)]), 0)
                self.assertEqual(sc.main(["env", str(good), "--container", "trainer"]), 0)
            self.assertIn("Job trainer: --shm-socket /run/orthoserve/shm.sock", out.getvalue())
            self.assertIn("ORTHOSERVE_SHM=on\n", out.getvalue())
            with self.assertRaisesRegex(sc.CheckError, "lost its sidecar"):
                sc.check_renders([str(good)], [str(plain)])
            broken = rendered()
            del self.volume(broken)["emptyDir"]["sizeLimit"]
            good.write_text(yaml.safe_dump_all(broken))
            with self.assertRaisesRegex(sc.CheckError, "Job trainer: emptyDir orthoserve-socket"):
                sc.check_renders([], [str(good)])

    def test_every_example_is_rendered_by_the_checks(self):
        examples = {f"examples/{p.parent.name}" for p in (kc.K8S / "examples").glob("*/kustomization.yaml")}
        self.assertLessEqual(examples, set(kc.KUSTOMIZATIONS))
        script = (kc.ROOT / "scripts/check_deploy.sh").read_text()
        for name in examples:
            self.assertIn(name, script)


if __name__ == "__main__":
    unittest.main(buffer=True)
