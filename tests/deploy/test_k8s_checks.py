#!/usr/bin/env python3
"""Tests for tests/deploy/k8s_checks.py: each check passes on the real deploy/k8s and fails on a
render (or a copy of the tree) that lacks the property it checks, so a check that cannot fail is
caught here. Run by scripts/check_deploy.sh with the .venv-deploy Python (PyYAML); KUBECTL names
kubectl (default: .venv-deploy's, then PATH).
"""
import copy
import os
import pathlib
import shutil
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import k8s_checks as kc  # noqa: E402

KUBECTL = kc.find_kubectl(os.environ.get("KUBECTL"))
_renders = {}


def rendered(name):
    """A fresh copy of deploy/k8s/NAME's render (rendered once per run)."""
    if name not in _renders:
        _renders[name] = kc.render(KUBECTL, kc.K8S / name)
    return copy.deepcopy(_renders[name])


def sts(objs, name=None):
    return next(o for o in objs if o["kind"] == "StatefulSet" and (name is None or o["metadata"]["name"] == name))


def pod(objs, name=None):
    return kc.pod_spec(sts(objs, name))


class TreeCopy(unittest.TestCase):
    """A scratch copy of deploy/k8s (self.tree) and the Dockerfile and operations.md."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = pathlib.Path(self._tmp.name)
        self.tree = self.tmp / "k8s"
        shutil.copytree(kc.K8S, self.tree)

    def tearDown(self):
        self._tmp.cleanup()

    def edit(self, rel, fn):
        p = self.tree / rel
        doc = yaml.safe_load(p.read_text())
        fn(doc)
        p.write_text(yaml.safe_dump(doc, sort_keys=False))


class ServiceAccountTest(unittest.TestCase):
    def check(self, objs, name=None):
        return kc.check_service_account(objs, sts(objs, name))

    def test_real_renders_pass(self):
        for k in ("base", "overlays/cpu", "overlays/gpu", "examples/tls"):
            self.assertEqual(self.check(rendered(k)), [], k)
        cells = rendered("examples/cells")
        for name in ("orthoserve-a", "orthoserve-b"):
            self.assertEqual(self.check(cells, name), [])
        self.assertEqual(pod(cells, "orthoserve-a")["serviceAccountName"], "orthoserve-a")

    def test_default_account_fails(self):
        objs = rendered("overlays/cpu")
        del pod(objs)["serviceAccountName"]
        self.assertRegex("\n".join(self.check(objs)), "runs as ServiceAccount 'default'")

    def test_token_mounted_by_the_pod_fails(self):
        objs = rendered("overlays/cpu")
        del pod(objs)["automountServiceAccountToken"]
        self.assertRegex("\n".join(self.check(objs)), "pod spec must set automountServiceAccountToken: false")
        objs = rendered("overlays/cpu")
        pod(objs)["volumes"].append({"name": "api", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}]}})
        self.assertRegex("\n".join(self.check(objs)), "volume api projects a ServiceAccount token")

    def test_account_that_mounts_tokens_fails(self):
        objs = rendered("overlays/cpu")
        next(o for o in objs if o["kind"] == "ServiceAccount")["automountServiceAccountToken"] = True
        self.assertRegex("\n".join(self.check(objs)), "ServiceAccount orthoserve must set automount")

    def test_missing_account_fails(self):
        objs = [o for o in rendered("overlays/cpu") if o["kind"] != "ServiceAccount"]
        self.assertRegex("\n".join(self.check(objs)), "ServiceAccount orthoserve is not in the render")

    def test_bound_role_fails(self):
        objs = rendered("overlays/cpu") + [{
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "orthoserve"}]}]
        self.assertRegex("\n".join(self.check(objs)), "RoleBinding reader grants ServiceAccount orthoserve")


class NodeSpreadTest(unittest.TestCase):
    def check(self, objs, name=None):
        return "\n".join(kc.check_node_spread(objs, sts(objs, name)))

    def spread(self, objs, name=None):
        return pod(objs, name)["topologySpreadConstraints"][0]

    def test_real_renders_pass(self):
        for k in ("base", "overlays/cpu", "overlays/gpu", "examples/tls"):
            self.assertEqual(self.check(rendered(k)), "", k)
        cells = rendered("examples/cells")
        self.assertEqual(self.check(cells, "orthoserve-a") + self.check(cells, "orthoserve-b"), "")
        self.assertEqual(self.spread(rendered("overlays/cpu"))["whenUnsatisfiable"], "ScheduleAnyway")
        self.assertEqual(self.spread(rendered("overlays/gpu"))["whenUnsatisfiable"], "DoNotSchedule")

    def test_no_spread_fails(self):
        objs = rendered("overlays/cpu")
        del pod(objs)["topologySpreadConstraints"]
        self.assertRegex(self.check(objs), "two ranks of the fleet may land on one node")

    def test_other_topology_or_skew_fails(self):
        objs = rendered("overlays/cpu")
        self.spread(objs)["topologyKey"] = "topology.kubernetes.io/zone"
        self.assertRegex(self.check(objs), "may land on one node")
        objs = rendered("overlays/cpu")
        self.spread(objs)["maxSkew"] = 2
        self.assertRegex(self.check(objs), "maxSkew 2, want 1")

    def test_selector_of_other_pods_fails(self):
        objs = rendered("overlays/cpu")
        self.spread(objs)["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] = "client"
        self.assertRegex(self.check(objs), "does not select the fleet's own pods")
        objs = rendered("overlays/cpu")
        del self.spread(objs)["labelSelector"]
        self.assertRegex(self.check(objs), "does not select the fleet's own pods")

    def test_selector_spanning_cells_fails(self):
        objs = rendered("examples/cells")
        del self.spread(objs, "orthoserve-a")["labelSelector"]["matchLabels"]["orthoserve.io/cell"]
        self.assertRegex(self.check(objs, "orthoserve-a"), "also selects another fleet's pods")

    def test_soft_spread_on_gpu_fails(self):
        objs = rendered("overlays/gpu")
        self.spread(objs)["whenUnsatisfiable"] = "ScheduleAnyway"
        self.assertRegex(self.check(objs), "backend cuda: the spread .* must be hard")

    def test_anti_affinity_is_accepted_instead(self):
        for k, kind in (("overlays/cpu", "preferred"), ("overlays/gpu", "required")):
            objs = rendered(k)
            spec = pod(objs)
            selector = spec.pop("topologySpreadConstraints")[0]["labelSelector"]
            term = {"topologyKey": kc.HOSTNAME, "labelSelector": selector}
            spec["affinity"] = {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term]} if kind == "required" else {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}}
            self.assertEqual(self.check(objs), "", k)
        objs = rendered("overlays/gpu")
        spec = pod(objs)
        selector = spec.pop("topologySpreadConstraints")[0]["labelSelector"]
        spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"topologyKey": kc.HOSTNAME, "labelSelector": selector}}]}}
        self.assertRegex(self.check(objs), "must be hard")

    def test_selector_semantics(self):
        labels = {"a": "1", "b": "2"}
        self.assertFalse(kc.selector_matches(None, labels))
        self.assertTrue(kc.selector_matches({}, labels))
        self.assertTrue(kc.selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]},
                                                                  {"key": "c", "operator": "DoesNotExist"}]}, labels))
        self.assertFalse(kc.selector_matches({"matchExpressions": [{"key": "b", "operator": "NotIn",
                                                                    "values": ["2"]}]}, labels))


class GpuNodesTest(unittest.TestCase):
    def check(self, objs):
        return "\n".join(kc.check_gpu_nodes(objs, sts(objs)))

    def test_real_renders_pass(self):
        self.assertEqual(self.check(rendered("overlays/gpu")), "")
        self.assertEqual(pod(rendered("overlays/gpu"))["nodeSelector"], {"nvidia.com/gpu.present": "true"})
        self.assertEqual(pod(rendered("overlays/gpu"))["runtimeClassName"], "nvidia")
        self.assertEqual(self.check(rendered("overlays/cpu")), "")  # not cuda: nothing asked

    def test_missing_node_selector_fails(self):
        objs = rendered("overlays/gpu")
        del pod(objs)["nodeSelector"]
        self.assertRegex(self.check(objs), "needs a nodeSelector")

    def test_missing_runtime_class_fails(self):
        objs = rendered("overlays/gpu")
        del pod(objs)["runtimeClassName"]
        self.assertRegex(self.check(objs), "needs runtimeClassName")

    def test_missing_toleration_fails(self):
        objs = rendered("overlays/gpu")
        pod(objs)["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
        self.assertRegex(self.check(objs), "toleration for the nvidia.com/gpu NoSchedule taint")

    def test_gpu_limit_must_be_one(self):
        objs = rendered("overlays/gpu")
        kc.dc.container(sts(objs))["resources"]["limits"]["nvidia.com/gpu"] = 2
        self.assertRegex(self.check(objs), "nvidia.com/gpu: 1 in the container's limits, not 2")

    def test_no_cuda_fleet_at_all_fails(self):
        with tempfile.TemporaryDirectory() as tmp:
            tree = pathlib.Path(tmp) / "k8s"
            shutil.copytree(kc.K8S, tree)
            shutil.rmtree(tree / "overlays/gpu")
            with self.assertRaisesRegex(kc.CheckError, "GPU overlay went unchecked"):
                kc.run_fleet_check(KUBECTL, kc.check_gpu_nodes, tree, need_cuda=True)


class MonitoringTest(TreeCopy):
    def test_real_tree_passes(self):
        kc.check_monitoring_opt_in(KUBECTL)
        for k in kc.OPERATOR_FREE:
            self.assertEqual(kc.check_operator_free(rendered(k)), [], k)

    def test_servicemonitor_in_base_fails(self):
        shutil.copy(self.tree / "components/monitoring/servicemonitor.yaml", self.tree / "base/servicemonitor.yaml")
        self.edit("base/kustomization.yaml", lambda d: d["resources"].append("servicemonitor.yaml"))
        with self.assertRaisesRegex(kc.CheckError, r"(?s)base: ServiceMonitor orthoserve .*needs the Prometheus "
                                                   r"Operator.*overlays/cpu: ServiceMonitor.*examples/tls: "
                                                   r"ServiceMonitor"):
            kc.check_monitoring_opt_in(KUBECTL, self.tree)

    def test_prometheusrule_in_an_overlay_fails(self):
        objs = rendered("overlays/gpu") + [{"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                                            "metadata": {"name": "orthoserve"}, "spec": {"groups": []}}]
        self.assertRegex("\n".join(kc.check_operator_free(objs)), "PrometheusRule orthoserve")

    def test_component_without_servicemonitor_fails(self):
        (self.tree / "components/monitoring/servicemonitor.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: not-a-monitor\n")
        with self.assertRaisesRegex(kc.CheckError, "components/monitoring: renders no monitoring.coreos.com"):
            kc.check_monitoring_opt_in(KUBECTL, self.tree)

    def test_servicemonitor_selecting_nothing_fails(self):
        self.edit("components/monitoring/servicemonitor.yaml",
                  lambda d: d["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/component": "client"}))
        with self.assertRaisesRegex(kc.CheckError, "0 ServiceMonitors select Service orthoserve-fleet, want 1"):
            kc.check_monitoring_opt_in(KUBECTL, self.tree)

    def test_cell_without_monitoring_and_double_scrape_fail(self):
        objs = [o for o in rendered("examples/cells")
                if not (o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == "orthoserve-b")]
        self.assertEqual(kc.check_monitored(objs, sts(objs, "orthoserve-a")), [])
        self.assertRegex("\n".join(kc.check_monitored(objs, sts(objs, "orthoserve-b"))), "0 ServiceMonitors")
        objs = rendered("overlays/cpu")
        objs += kc.operator_objects(kc.monitoring_component_render(KUBECTL, kc.K8S)) * 2
        self.assertRegex("\n".join(kc.check_monitored(objs, sts(objs))), "2 ServiceMonitors select")

    def test_servicemonitor_on_a_port_the_service_lacks_fails(self):
        objs = kc.monitoring_component_render(KUBECTL, kc.K8S)
        next(o for o in objs if o["kind"] == "ServiceMonitor")["spec"]["endpoints"][0]["port"] = "http-metrics"
        self.assertRegex("\n".join(kc.check_monitored(objs, sts(objs))), "scrapes none of Service orthoserve-fleet")


class WorldFromReplicasTest(TreeCopy):
    def test_real_tree_passes(self):
        sized = kc.check_world_sources()
        self.assertEqual(set(sized), {"base", "overlays/cpu", "overlays/gpu", "examples/cells/cell-a",
                                      "examples/cells/cell-b"})
        kc.check_world_follows(KUBECTL)

    def drop_replacement(self, rel):
        self.edit(rel, lambda d: d.__setitem__(
            "replacements", [r for r in d["replacements"] if not kc.is_world_replacement(r)]))

    def test_size_without_replacement_fails_statically_and_when_rendered(self):
        self.drop_replacement("examples/cells/cell-a/kustomization.yaml")
        with self.assertRaisesRegex(kc.CheckError, "cell-a/kustomization.yaml sets the fleet's size but has no "
                                                   "replacement"):
            kc.check_world_sources(self.tree)
        # Rendered: cell-a keeps the WORLD base computed (2) while its replicas are 4.
        with self.assertRaisesRegex(kc.CheckError, r"examples/cells: StatefulSet orthoserve-a: ORTHOSERVE_WORLD '2' "
                                                   r"differs from replicas 4"):
            kc.check_world_follows(KUBECTL, self.tree)

    def test_overlay_without_replacement_fails_though_its_size_equals_base(self):
        # overlays/cpu's size equals base's, so its own render is consistent; with the sizes
        # raised by different amounts WORLD stays at base's.
        self.drop_replacement("overlays/cpu/kustomization.yaml")
        with self.assertRaisesRegex(kc.CheckError, r"overlays/cpu with other sizes: StatefulSet orthoserve: "
                                                   r"ORTHOSERVE_WORLD stays '5' while replicas is \d+") as cm:
            kc.check_world_follows(KUBECTL, self.tree)
        self.assertIn("examples/tls with other sizes", str(cm.exception))  # built on overlays/cpu
        self.assertNotIn("overlays/gpu", str(cm.exception))

    def test_world_set_by_hand_fails(self):
        self.edit("examples/cells/cell-b/kustomization.yaml", lambda d: d.__setitem__("configMapGenerator", [
            {"name": "orthoserve-config", "behavior": "merge", "literals": ["ORTHOSERVE_WORLD=2"]}]))
        with self.assertRaisesRegex(kc.CheckError, "cell-b/kustomization.yaml: sets ORTHOSERVE_WORLD=2 by hand"):
            kc.check_world_sources(self.tree)
        env = self.tree / "base/orthoserve.env"
        env.write_text(env.read_text().replace("ORTHOSERVE_WORLD=from-replicas", "ORTHOSERVE_WORLD=2"))
        with self.assertRaisesRegex(kc.CheckError, "base/orthoserve.env: sets ORTHOSERVE_WORLD=2 by hand"):
            kc.check_world_sources(self.tree)

    def test_world_that_does_not_roll_the_pods_fails(self):
        # Without the name hash, WORLD follows in the ConfigMap but the pod template stays the
        # same: running pods would keep the old size.
        self.edit("base/kustomization.yaml", lambda d: d.__setitem__(
            "generatorOptions", {"disableNameSuffixHash": True}))
        with self.assertRaisesRegex(kc.CheckError, r"base with other sizes: StatefulSet orthoserve: ConfigMap name "
                                                   r"\['orthoserve-config'\] unchanged: the pods would not roll"):
            kc.check_world_follows(KUBECTL, self.tree)

    def test_overlay_of_ones_own_without_the_block_fails(self):
        # What docs/operations.md tells an overlay to copy is taken from base: without it there,
        # the overlay setting replicas 5 gets no WORLD 5 (and base's own render fails first).
        self.drop_replacement("base/kustomization.yaml")
        with self.assertRaisesRegex(kc.CheckError, r"(?s)ORTHOSERVE_WORLD 'from-replicas' differs from replicas 2.*"
                                                   r"base \+ an overlay setting replicas 5 with base's replacement: "
                                                   r"replicas 5, ORTHOSERVE_WORLD 'from-replicas'"):
            kc.check_world_follows(KUBECTL, self.tree)


class GpuDriverDocsTest(TreeCopy):
    def copy(self, dockerfile=None, docs=None):
        d, o = self.tmp / "Dockerfile", self.tmp / "operations.md"
        d.write_text(dockerfile if dockerfile is not None else (kc.ROOT / "Dockerfile").read_text())
        o.write_text(docs if docs is not None else (kc.ROOT / "docs/operations.md").read_text())
        return d, o

    def test_real_files_pass(self):
        kc.check_gpu_driver_docs()

    def test_label_drift_fails(self):
        text = (kc.ROOT / "Dockerfile").read_text().replace('nvidia-driver.min="580.65.06"',
                                                            'nvidia-driver.min="570.86.10"')
        with self.assertRaisesRegex(kc.CheckError, "LABEL io.orthoserve.nvidia-driver.min='570.86.10', want "
                                                   "'580.65.06'"):
            kc.check_gpu_driver_docs(*self.copy(dockerfile=text))

    def test_missing_labels_fail(self):
        text = "\n".join(line for line in (kc.ROOT / "Dockerfile").read_text().splitlines()
                         if "io.orthoserve." not in line)
        with self.assertRaisesRegex(kc.CheckError, "LABEL io.orthoserve.cuda.version=None"):
            kc.check_gpu_driver_docs(*self.copy(dockerfile=text))

    def test_cuda_bump_without_tables_fails(self):
        text = (kc.ROOT / "Dockerfile").read_text().replace("nvidia/cuda:13.0.2-", "nvidia/cuda:13.9.0-")
        with self.assertRaisesRegex(kc.CheckError, "CUDA 13.9.0 is not in .*driver tables"):
            kc.check_gpu_driver_docs(*self.copy(dockerfile=text))

    def test_devel_and_runtime_must_agree(self):
        text = (kc.ROOT / "Dockerfile").read_text().replace("nvidia/cuda:13.0.2-devel", "nvidia/cuda:13.0.1-devel")
        with self.assertRaisesRegex(kc.CheckError, "built with CUDA 13.0.1, run on 13.0.2"):
            kc.check_gpu_driver_docs(*self.copy(dockerfile=text))

    def test_docs_without_the_driver_fail(self):
        docs = (kc.ROOT / "docs/operations.md").read_text().replace("580.65.06", "580.x")
        with self.assertRaisesRegex(kc.CheckError, "does not state the minimum driver, 580.65.06"):
            kc.check_gpu_driver_docs(*self.copy(docs=docs))


class CliTest(unittest.TestCase):
    def test_list_names_every_check(self):
        self.assertEqual(set(kc.CHECKS), {"service-account", "node-spread", "gpu-nodes", "monitoring-opt-in",
                                          "world-from-replicas", "gpu-driver-docs"})


if __name__ == "__main__":
    unittest.main(buffer=True)
