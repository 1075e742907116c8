#!/usr/bin/env python3
"""Tests for tests/deploy/deploy_checks.py: each check passes on the real files and fails on a
broken copy, so a check that cannot fail is caught here. Run by scripts/check_deploy.sh with the
.venv-deploy Python (PyYAML); RENDER_DIR names the folder with the rendered kustomizations.
"""
import copy
import json
import os
import pathlib
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import deploy_checks as dc  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
RENDER_DIR = pathlib.Path(os.environ.get("RENDER_DIR", ""))


class TempDir(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = pathlib.Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def write(self, name, text):
        p = self.tmp / name
        p.write_text(text)
        return str(p)


class PromqlNamesTest(unittest.TestCase):
    def test_finds_selected_metrics_only(self):
        expr = ('histogram_quantile(0.99, sum by (stage, le) (rate(orthoserve_stage_duration_seconds_bucket'
                '{namespace=~"$namespace", cell=~"a|b"}[$__rate_interval]))) / ignoring (kind) '
                'orthoserve_x{kind="used"} offset 5m > bool 3 and on (pod) up')
        self.assertEqual(dc.promql_metric_names(expr),
                         {"orthoserve_stage_duration_seconds_bucket", "orthoserve_x", "up"})

    def test_recording_rule_names_and_aggregations_after(self):
        self.assertEqual(dc.promql_metric_names('sum(cell:foo:ratio) without (pod) - rate(bar_total[1h:5m])'),
                         {"cell:foo:ratio", "bar_total"})

    def test_label_values_in_strings_are_not_names(self):
        self.assertEqual(dc.promql_metric_names('orthoserve_a{code="orthoserve_not_a_metric"}'), {"orthoserve_a"})


SCRAPE = """# HELP orthoserve_requests_total Requests.
# TYPE orthoserve_requests_total counter
# TYPE orthoserve_stage_duration_seconds histogram
orthoserve_stage_duration_seconds_bucket{stage="queue",le="0.1"} 0
# TYPE orthoserve_fleet_ready gauge
orthoserve_fleet_ready 1
"""


class MetricNamesTest(TempDir):
    def board(self, expr):
        return self.write("d.json", '{"panels": [{"title": "t", "targets": [{"expr": %s}]}]}' % repr(expr).replace(
            "'", '"'))

    def test_known_names_pass(self):
        scrape = self.write("scrape.txt", SCRAPE)
        board = self.board("sum(rate(orthoserve_stage_duration_seconds_count[5m])) + orthoserve_fleet_ready")
        dc.check_metric_names(scrape, [board], [])

    def test_unknown_name_fails_naming_panel_and_metric(self):
        scrape = self.write("scrape.txt", SCRAPE)
        board = self.board("rate(orthoserve_requests[5m])")
        with self.assertRaisesRegex(dc.CheckError, r"panel 't'.*orthoserve_requests is not exported"):
            dc.check_metric_names(scrape, [board], [])

    def test_histogram_base_name_is_not_a_series(self):
        scrape = self.write("scrape.txt", SCRAPE)
        with self.assertRaisesRegex(dc.CheckError, "orthoserve_stage_duration_seconds is not exported"):
            dc.check_metric_names(scrape, [self.board("orthoserve_stage_duration_seconds")], [])

    def test_rules_may_use_their_own_recorded_names(self):
        scrape = self.write("scrape.txt", SCRAPE)
        rules = self.write("r.yaml", yaml.safe_dump({"groups": [{"name": "g", "rules": [
            {"record": "cell:x:rate", "expr": "sum(rate(orthoserve_requests_total[5m]))"},
            {"alert": "A", "expr": "cell:x:rate > 1"},
            {"alert": "B", "expr": "orthoserve_missing > 1"}]}]}))
        with self.assertRaisesRegex(dc.CheckError, "r.yaml: B: metric orthoserve_missing") as cm:
            dc.check_metric_names(scrape, [], [rules])
        self.assertNotIn("cell:x:rate", str(cm.exception))

    def test_real_dashboard_and_rules_against_a_scrape_missing_one_family(self):
        # Every family the real files use, minus orthoserve_queue_depth: exactly that one is reported.
        names = set()
        for _, e in dc.dashboard_exprs(ROOT / "deploy/grafana/orthoserve.json"):
            names |= dc.promql_metric_names(e)
        exprs, recorded = dc.rules_exprs(ROOT / "deploy/prometheus/orthoserve-rules.yaml")
        for _, e in exprs:
            names |= dc.promql_metric_names(e)
        lines = [f"# TYPE {n} gauge" for n in sorted(names - recorded - {"up", "orthoserve_queue_depth"})]
        scrape = self.write("scrape.txt", "\n".join(lines) + "\n")
        with self.assertRaises(dc.CheckError) as cm:
            dc.check_metric_names(scrape, [str(ROOT / "deploy/grafana/orthoserve.json")],
                                  [str(ROOT / "deploy/prometheus/orthoserve-rules.yaml")])
        self.assertIn("orthoserve_queue_depth", str(cm.exception))
        self.assertEqual({ln.rsplit("metric ", 1)[1].split()[0] for ln in str(cm.exception).splitlines()},
                         {"orthoserve_queue_depth"})


@unittest.skipUnless((RENDER_DIR / "examples_cells.yaml").exists(), "needs RENDER_DIR from check_deploy.sh")
class RenderedTest(TempDir):
    def load(self):
        return dc.load_objects(RENDER_DIR / "examples_cells.yaml")

    def check(self, objs):
        dc.check_rendered(self.write("r.yaml", yaml.safe_dump_all(objs)))

    def sts(self, objs, name="orthoserve-a"):
        return next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name)

    def test_real_render_passes(self):
        self.check(self.load())

    def test_rename_without_replacements_fails(self):
        objs = self.load()
        env = dc.container(self.sts(objs))["env"]
        next(e for e in env if e["name"] == "FLEET_SERVICE")["value"] = "orthoserve-fleet"
        with self.assertRaisesRegex(dc.CheckError, "FLEET_SERVICE is 'orthoserve-fleet'"):
            self.check(objs)

    def test_world_must_equal_replicas(self):
        objs = self.load()
        self.sts(objs)["spec"]["replicas"] = 3
        with self.assertRaisesRegex(dc.CheckError, "replicas 3 differs from ORTHOSERVE_WORLD 4"):
            self.check(objs)

    def test_grace_period_must_cover_the_drain(self):
        objs = self.load()
        self.sts(objs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
        with self.assertRaisesRegex(dc.CheckError, r"terminationGracePeriodSeconds 30 < drain 30s \+ preStop 5s"):
            self.check(objs)

    def test_grace_period_must_cover_the_leave_and_the_backstop(self):
        # 45s covered preStop + drain + 5s, the crash-only fleet's rule; the graceful leave and
        # the server's backstop (drain + 10s) need 15s beyond preStop + drain.
        objs = self.load()
        self.sts(objs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 49
        with self.assertRaisesRegex(dc.CheckError,
                                    r"terminationGracePeriodSeconds 49 < drain 30s \+ preStop 5s \+ 15s"):
            self.check(objs)
        self.sts(objs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 50
        self.check(objs)

    def test_disruption_budget_must_allow_one_rank_down(self):
        objs = self.load()
        pdb = next(o for o in objs if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "orthoserve-a")
        pdb["spec"]["maxUnavailable"] = 2
        with self.assertRaisesRegex(dc.CheckError, "PodDisruptionBudget orthoserve-a must allow exactly one rank down"):
            self.check(objs)
        del pdb["spec"]["maxUnavailable"]
        pdb["spec"]["minAvailable"] = 4  # every rank: node drains would block for good
        with self.assertRaisesRegex(dc.CheckError, "minAvailable 4"):
            self.check(objs)
        pdb["spec"]["minAvailable"] = 3
        self.check(objs)

    def test_rollout_must_take_one_rank_at_a_time(self):
        objs = self.load()
        self.sts(objs)["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "50%"
        with self.assertRaisesRegex(dc.CheckError, "rollingUpdate.maxUnavailable is '50%'"):
            self.check(objs)
        self.sts(objs)["spec"]["updateStrategy"] = {"type": "OnDelete"}
        with self.assertRaisesRegex(dc.CheckError, "updateStrategy.type must be RollingUpdate, not 'OnDelete'"):
            self.check(objs)

    def test_headless_service_must_publish_not_ready(self):
        objs = self.load()
        svc = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "orthoserve-fleet-b")
        del svc["spec"]["publishNotReadyAddresses"]
        with self.assertRaisesRegex(dc.CheckError, "orthoserve-b: Service orthoserve-fleet-b needs publishNotReady"):
            self.check(objs)

    def test_network_policy_must_not_open_the_fleet_port(self):
        objs = self.load()
        pol = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "orthoserve-a")
        pol["spec"]["ingress"][0]["ports"].append({"port": 50061, "protocol": "TCP"})
        with self.assertRaisesRegex(dc.CheckError, "opens the fleet port to pods outside the fleet"):
            self.check(objs)

    def test_network_policy_from_another_cell_fails(self):
        objs = self.load()
        pol = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "orthoserve-a")
        pol["spec"]["ingress"][1]["from"][0]["podSelector"]["matchLabels"]["orthoserve.io/cell"] = "b"
        with self.assertRaisesRegex(dc.CheckError, "NetworkPolicy orthoserve-a opens the fleet port"):
            self.check(objs)

    def test_egress_must_be_limited_to_the_fleet_and_dns(self):
        objs = self.load()
        pol = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "orthoserve-a")
        pol["spec"]["egress"].append({})  # To everywhere.
        with self.assertRaisesRegex(dc.CheckError, "NetworkPolicy orthoserve-a has an egress rule to everywhere"):
            self.check(objs)
        pol["spec"]["egress"][-1] = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}
        with self.assertRaisesRegex(dc.CheckError, "lets the fleet pods reach any address"):
            self.check(objs)
        pol["spec"]["egress"][-1] = {"to": [{"namespaceSelector": {}}], "ports": [{"port": 443, "protocol": "TCP"}]}
        with self.assertRaisesRegex(dc.CheckError, "other namespaces on ports other than DNS"):
            self.check(objs)
        pol["spec"]["egress"].pop()
        pol["spec"]["egress"].pop()  # The DNS rule.
        with self.assertRaisesRegex(dc.CheckError, "reach the cluster DNS"):
            self.check(objs)

    def test_egress_must_be_limited_at_all(self):
        objs = self.load()
        pol = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "orthoserve-b")
        pol["spec"]["policyTypes"] = ["Ingress"]
        with self.assertRaisesRegex(dc.CheckError, "no NetworkPolicy limits the fleet pods' egress"):
            self.check(objs)

    def test_every_emptydir_needs_a_size_limit(self):
        objs = self.load()
        vols = self.sts(objs)["spec"]["template"]["spec"]["volumes"]
        next(v for v in vols if v["name"] == "tmp")["emptyDir"] = {}
        with self.assertRaisesRegex(dc.CheckError, "emptyDir volume tmp has no sizeLimit"):
            self.check(objs)

    def test_the_call_rate_limit_must_be_set(self):
        objs = self.load()
        for cm in (o for o in objs if o["kind"] == "ConfigMap" and "ORTHOSERVE_MAX_TENANT_CALLS_PER_SECOND" in
                   o.get("data", {})):
            cm["data"]["ORTHOSERVE_MAX_TENANT_CALLS_PER_SECOND"] = "0"
        with self.assertRaisesRegex(dc.CheckError, "set the call-rate limit"):
            self.check(objs)

    def test_servicemonitor_selecting_both_cells_fails(self):
        objs = self.load()
        mon = next(o for o in objs if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == "orthoserve-a")
        del mon["spec"]["selector"]["matchLabels"]["orthoserve.io/cell"]
        with self.assertRaisesRegex(dc.CheckError, "ServiceMonitor orthoserve-a also selects orthoserve-b"):
            self.check(objs)

    def configmap(self, objs, sts):
        ref = dc.container(sts)["envFrom"][0]["configMapRef"]["name"]
        return next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == ref)

    def test_liveness_on_the_public_port_fails(self):
        # The public port's health turns NOT_SERVING for the drain: liveness there would kill
        # draining ranks (and it says nothing about a wedged fleet executor).
        objs = self.load()
        command = dc.container(self.sts(objs))["livenessProbe"]["exec"]["command"]
        command[2] = command[2].replace("127.0.0.1:50061", "127.0.0.1:50051")
        with self.assertRaisesRegex(dc.CheckError, "livenessProbe must be `orthoctl health` on the fleet port 50061"):
            self.check(objs)
        dc.container(self.sts(objs))["livenessProbe"] = {"grpc": {"port": 50051}}
        with self.assertRaisesRegex(dc.CheckError, "plaintext gRPC probe but the fleet port is under fleet TLS"):
            self.check(objs)

    def test_plaintext_liveness_under_fleet_tls_fails(self):
        objs = self.load()
        dc.container(self.sts(objs))["livenessProbe"] = {"grpc": {"port": 50061}, "periodSeconds": 10}
        with self.assertRaisesRegex(dc.CheckError, "orthoserve-a: livenessProbe is a plaintext gRPC probe but the "
                                                   "fleet port is under fleet TLS"):
            self.check(objs)

    def test_liveness_must_present_the_fleet_certificate(self):
        objs = self.load()
        command = dc.container(self.sts(objs))["livenessProbe"]["exec"]["command"]
        command[2] = command[2].replace("--tls-cert=/etc/orthoserve/fleet-tls/tls.crt",
                                        "--tls-cert=/etc/orthoserve/tls/tls.crt")
        with self.assertRaisesRegex(dc.CheckError, "with the fleet certificate the server uses"):
            self.check(objs)

    def test_fleet_tls_must_be_on(self):
        objs = self.load()
        del self.configmap(objs, self.sts(objs))["data"]["ORTHOSERVE_FLEET_TLS_CA"]
        with self.assertRaisesRegex(dc.CheckError, "orthoserve-a: the fleet port must run with mutual TLS"):
            self.check(objs)

    def test_member_name_must_be_the_pods_dns_name(self):
        objs = self.load()
        env = dc.container(self.sts(objs, "orthoserve-b"))["env"]
        next(e for e in env if e["name"] == "ORTHOSERVE_FLEET_TLS_MEMBER_NAME")["value"] = "orthoserve-rank-{rank}"
        with self.assertRaisesRegex(dc.CheckError, "orthoserve-b: pod 0's fleet member name is 'orthoserve-rank-0', "
                                                   "not its DNS name 'orthoserve-b-0.orthoserve-fleet-b.orthoserve.svc'"):
            self.check(objs)
        # Without {rank}, one name for every pod: not the pods' DNS names either.
        next(e for e in env if e["name"] == "ORTHOSERVE_FLEET_TLS_MEMBER_NAME")["value"] = "orthoserve-b.svc"
        with self.assertRaisesRegex(dc.CheckError, "fleet member name is 'orthoserve-b.svc'"):
            self.check(objs)

    def test_fleet_tls_files_must_come_from_the_fleet_secret(self):
        objs = self.load()
        volumes = self.sts(objs)["spec"]["template"]["spec"]["volumes"]
        next(v for v in volumes if v["name"] == "fleet-tls")["secret"]["secretName"] = "orthoserve-tls"
        with self.assertRaisesRegex(dc.CheckError, "must come from the Secret orthoserve-fleet-tls, not 'orthoserve-tls'"):
            self.check(objs)
        mounts = dc.container(self.sts(objs))["volumeMounts"]
        mounts[:] = [m for m in mounts if m["name"] != "fleet-tls"]
        with self.assertRaisesRegex(dc.CheckError, "ORTHOSERVE_FLEET_TLS_CERT=/etc/orthoserve/fleet-tls/tls.crt is on "
                                                   "no mounted volume"):
            self.check(objs)

    def test_cert_manager_certificate_covers_every_pod_with_both_usages(self):
        objs = dc.load_objects(RENDER_DIR / "examples_fleet-tls-cert-manager.yaml")
        dc.check_rendered(self.write("ok.yaml", yaml.safe_dump_all(objs)))
        cert = next(o for o in objs if o["kind"] == "Certificate" and o["metadata"]["name"] == "orthoserve-fleet-tls")
        for bad, message in (({"dnsNames": ["*.orthoserve-fleet.other.svc"]}, "do not cover pod 0's member name"),
                             ({"dnsNames": ["*.svc"]}, "do not cover pod 0's member name"),
                             ({"usages": ["digital signature", "server auth"]}, "needs the usages server auth and "
                                                                                 "client auth"),
                             ({"issuerRef": {"name": "elsewhere", "kind": "Issuer"}}, "issuer 'elsewhere' is not in")):
            broken = copy.deepcopy(objs)
            next(o for o in broken if o is not None and o.get("kind") == "Certificate"
                 and o["metadata"]["name"] == "orthoserve-fleet-tls")["spec"].update(bad)
            with self.assertRaisesRegex(dc.CheckError, message):
                self.check(broken)
        self.assertTrue(dc.dns_name_matches("orthoserve-1.orthoserve-fleet.orthoserve.svc",
                                            "*.orthoserve-fleet.orthoserve.svc"))
        self.assertFalse(dc.dns_name_matches("a.orthoserve-1.orthoserve-fleet.orthoserve.svc",
                                             "*.orthoserve-fleet.orthoserve.svc"))
        del cert["spec"]["secretName"]
        with self.assertRaisesRegex(dc.CheckError, "Certificate orthoserve-fleet-tls: spec.secretName is required"):
            dc.split_rendered(self.write("r.yaml", yaml.safe_dump_all(objs)), self.tmp / "b", self.tmp / "c")

    def test_plaintext_readiness_under_tls_fails(self):
        objs = dc.load_objects(RENDER_DIR / "examples_tls.yaml")
        dc.check_rendered(self.write("ok.yaml", yaml.safe_dump_all(objs)))
        dc.container(self.sts(objs, "orthoserve"))["readinessProbe"] = {
            "grpc": {"port": 50051, "service": "orthoserve.v1.Orthogonalizer"}}
        with self.assertRaisesRegex(dc.CheckError, "plaintext gRPC probe but the port is under TLS"):
            self.check(objs)

    def test_elected_coordinator_in_cluster_etcd(self):
        objs = dc.load_objects(RENDER_DIR / "examples_etcd.yaml")
        path = self.write("ok.yaml", yaml.safe_dump_all(objs))
        dc.check_rendered(path)
        dc.check_etcd_example(path, 3, False)
        with self.assertRaisesRegex(dc.CheckError, "has 3 replicas, want 5"):
            dc.check_etcd_example(path, 5, False)
        with self.assertRaisesRegex(dc.CheckError, "the render has etcd StatefulSet"):
            dc.check_etcd_example(path, 0, True)
        broken = copy.deepcopy(objs)  # The base's coordinator left in place.
        dc.container(self.sts(broken, "orthoserve"))["env"].append({"name": "ORTHOSERVE_COORDINATOR", "value": "x:1"})
        with self.assertRaisesRegex(dc.CheckError, "ORTHOSERVE_COORDINATOR is set"):
            self.check(broken)
        broken = copy.deepcopy(objs)  # No egress to etcd's client port.
        pol = next(o for o in broken if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "orthoserve")
        pol["spec"]["egress"] = [r for r in pol["spec"]["egress"]
                                 if {p.get("port") for p in r.get("ports", [])} != {2379}]
        with self.assertRaisesRegex(dc.CheckError, "no egress rule lets the fleet pods reach etcd at orthoserve-etcd-0"):
            self.check(broken)
        broken = copy.deepcopy(objs)  # Egress to etcd's pods on their peer port as well: outside the fleet.
        pol = next(o for o in broken if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "orthoserve")
        next(r for r in pol["spec"]["egress"] if {p.get("port") for p in r.get("ports", [])} == {2379})["ports"].append(
            {"port": 2380, "protocol": "TCP"})
        with self.assertRaisesRegex(dc.CheckError, "reach pods outside the fleet"):
            self.check(broken)
        broken = copy.deepcopy(objs)  # Membership naming other hosts than the etcd StatefulSet's pods.
        cm = next(o for o in broken if o["kind"] == "ConfigMap" and "ORTHOSERVE_MEMBERSHIP" in o.get("data", {}))
        cm["data"]["ORTHOSERVE_MEMBERSHIP"] = "etcd://orthoserve-etcd-0.orthoserve-etcd:2379/orthoserve/orthoserve"
        with self.assertRaisesRegex(dc.CheckError, "not the members of etcd StatefulSet orthoserve-etcd"):
            self.check(broken)

    def test_elected_coordinator_in_external_etcd(self):
        objs = dc.load_objects(RENDER_DIR / "examples_etcd-external.yaml")
        path = self.write("ok.yaml", yaml.safe_dump_all(objs))
        dc.check_rendered(path)
        dc.check_etcd_example(path, 0, True)
        cm = next(o for o in objs if o["kind"] == "ConfigMap" and "ORTHOSERVE_MEMBERSHIP" in o.get("data", {}))
        cm["data"]["ORTHOSERVE_MEMBERSHIP"] = "etcd://10.20.0.11:2379,10.30.0.9:2379/orthoserve/x"
        with self.assertRaisesRegex(dc.CheckError, "no egress rule lets the fleet pods reach etcd at 10.30.0.9:2379"):
            self.check(objs)
        cm["data"]["ORTHOSERVE_MEMBERSHIP"] = "static"
        with self.assertRaisesRegex(dc.CheckError, "not etcd://"):
            dc.check_etcd_example(self.write("static.yaml", yaml.safe_dump_all(objs)), 0, True)

    def test_cuda_without_gpu_limit_fails(self):
        objs = dc.load_objects(RENDER_DIR / "overlays_gpu.yaml")
        dc.check_rendered(self.write("ok.yaml", yaml.safe_dump_all(objs)))
        del dc.container(self.sts(objs, "orthoserve"))["resources"]["limits"]["nvidia.com/gpu"]
        with self.assertRaisesRegex(dc.CheckError, "nvidia.com/gpu: 1"):
            self.check(objs)

    def test_pod_env_expands_references(self):
        env = dc.pod_env(self.load(), self.sts(self.load(), "orthoserve-b"), 1, "ml")
        self.assertEqual(env["ORTHOSERVE_COORDINATOR"], "orthoserve-b-0.orthoserve-fleet-b.ml.svc:50061")
        self.assertEqual(env["ORTHOSERVE_ADVERTISE_ADDRESS"], "orthoserve-b-1.orthoserve-fleet-b.ml.svc:50051")
        self.assertEqual(env["ORTHOSERVE_POD_INDEX"], "1")

    def test_split_rejects_unknown_custom_resources_and_bad_servicemonitors(self):
        objs = self.load()
        bad = copy.deepcopy(objs) + [{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}]
        with self.assertRaisesRegex(dc.CheckError, "Widget .* custom resource this check does not know"):
            dc.split_rendered(self.write("r.yaml", yaml.safe_dump_all(bad)), self.tmp / "b", self.tmp / "c")
        mon = next(o for o in objs if o["kind"] == "ServiceMonitor")
        mon["spec"]["endpoints"][0]["intervall"] = "15s"
        with self.assertRaisesRegex(dc.CheckError, r"unknown fields \['intervall'\]"):
            dc.split_rendered(self.write("r.yaml", yaml.safe_dump_all(objs)), self.tmp / "b", self.tmp / "c")


class DockerfileReadmeTest(TempDir):
    README = "# x\n\n```sh\n./scripts/setup.sh && ./build/bin/orthoserve --listen 127.0.0.1:50051\n```\n"

    def dockerfile(self):
        return (ROOT / "Dockerfile").read_text()

    def check(self, dockerfile, readme=README):
        d = self.write("Dockerfile", dockerfile)
        dc.check_dockerfile_args(d)
        dc.check_dockerfile_readme(d, self.write("README.md", readme))

    def test_real_dockerfile_passes(self):
        self.check(self.dockerfile())

    def test_other_build_dir_fails(self):
        text = self.dockerfile().replace("RUN ORTHOSERVE_SKIP_VENV=1 ORTHOSERVE_WITH_CUDA=OFF ./scripts/setup.sh",
                                         "RUN ORTHOSERVE_BUILD_DIR=out ORTHOSERVE_SKIP_VENV=1 ./scripts/setup.sh")
        with self.assertRaisesRegex(dc.CheckError, "stage build-cpu sets ORTHOSERVE_BUILD_DIR='out'"):
            self.check(text)

    def test_readme_option_missing_in_dockerfile_fails(self):
        readme = self.README.replace("./scripts/setup.sh &&", "ORTHOSERVE_EXTRA=1 ./scripts/setup.sh &&")
        with self.assertRaisesRegex(dc.CheckError, "sets ORTHOSERVE_EXTRA=None, the README ORTHOSERVE_EXTRA='1'"):
            self.check(self.dockerfile(), readme)

    def test_own_cmake_in_build_stage_fails(self):
        text = self.dockerfile().replace("RUN ORTHOSERVE_SKIP_VENV=1 ORTHOSERVE_WITH_CUDA=ON ./scripts/setup.sh",
                                         "RUN ORTHOSERVE_SKIP_VENV=1 ORTHOSERVE_WITH_CUDA=ON ./scripts/setup.sh"
                                         " && cmake --build build --target extra")
        with self.assertRaisesRegex(dc.CheckError, "stage build-gpu runs `cmake --build build --target extra`"):
            self.check(text)

    def test_unpinned_base_fails(self):
        text = self.dockerfile().replace("ARG DEBIAN_IMAGE=debian:bookworm-", "ARG DEBIAN_IMAGE=debian:latest #")
        with self.assertRaisesRegex(dc.CheckError, "DEBIAN_IMAGE=debian:latest is not pinned"):
            self.check(text)

    def test_root_user_and_missing_healthcheck_fail(self):
        text = self.dockerfile().replace("USER ${ORTHOSERVE_UID}:${ORTHOSERVE_UID}\n", "", 1)
        with self.assertRaisesRegex(dc.CheckError, "stage cpu runs as root"):
            self.check(text)
        text = self.dockerfile().replace('CMD ["orthoctl", "health"', 'CMD ["true"', 1)
        with self.assertRaisesRegex(dc.CheckError, "stage cpu has no HEALTHCHECK"):
            self.check(text)

    def test_readme_without_setup_fails(self):
        with self.assertRaisesRegex(dc.CheckError, "does not run ./scripts/setup.sh"):
            self.check(self.dockerfile(), "```sh\ncmake -B build && ./build/bin/orthoserve\n```\n")


class FakePrometheus:
    """A loopback HTTP server answering /api/v1/query like Prometheus, from a function of the query."""

    def __init__(self, answer):
        import http.server
        import threading
        import urllib.parse

        self.queries = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 -- the http.server API
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
                outer.queries.append(query)
                status, body = answer(query)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def vector(*samples):
    """A successful instant-vector answer: samples are (labels dict, value string)."""
    return 200, {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1700000000, value]} for labels, value in samples]}}


class DashboardDataTest(TempDir):
    BOARD = {
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "cell", "type": "query",
             "query": {"query": 'label_values(orthoserve_build_info{namespace=~"$namespace"}, cell)'}}]},
        "panels": [
            {"type": "row", "title": "r", "panels": [
                {"title": "Collective", "targets": [
                    {"refId": "A", "expr": 'histogram_quantile(0.5, sum by (op, le) (rate('
                                           'orthoserve_collective_duration_seconds_bucket{cell=~"$cell"}'
                                           '[$__rate_interval])))'}]}]},
            {"title": "Errors", "targets": [
                {"refId": "A", "expr": 'sum(rate(orthoserve_requests_total{code!="OK"}[$__rate_interval]))'}]}],
    }

    def setUp(self):
        super().setUp()
        self.board = self.write("board.json", json.dumps(self.BOARD))
        self.rules = self.write("rules.yaml", yaml.safe_dump({"groups": [{"name": "g", "rules": [
            {"record": "cell:x:ratio", "expr": "sum(rate(orthoserve_requests_total[5m]))"},
            {"alert": "A", "expr": "cell:x:ratio > 1"}]}]}))

    def serve(self, answer):
        fake = FakePrometheus(answer)
        self.addCleanup(fake.close)
        return fake

    @staticmethod
    def healthy(query):
        if query.startswith("histogram_quantile"):
            return vector(({"op": "barrier"}, "NaN"), ({"op": "all_gatherv"}, "0.002"))
        if query.startswith("orthoserve_build_info"):
            return vector(({"__name__": "orthoserve_build_info", "namespace": "ml", "cell": "orthoserve"}, "1"))
        return vector(({}, "0.5"))

    def test_queries_with_a_finite_value_pass(self):
        fake = self.serve(self.healthy)
        dc.check_dashboard_data(fake.url, [self.board], [self.rules], wait=0)
        # Grafana's variables are replaced; alerts are not queried (they are empty when all is well).
        self.assertIn('orthoserve_build_info{namespace=~".*"}', fake.queries)
        self.assertTrue(any("[5m]" in q and "$" not in q for q in fake.queries))
        self.assertNotIn("cell:x:ratio > 1", fake.queries)
        self.assertEqual(len(fake.queries), 4)

    def test_a_panel_of_only_nan_fails_naming_it(self):
        def nan_collective(query):
            if query.startswith("histogram_quantile"):  # The symptom of a histogram nobody observes.
                return vector(({"op": "barrier"}, "NaN"), ({"op": "all_gatherv"}, "NaN"))
            return self.healthy(query)

        fake = self.serve(nan_collective)
        with self.assertRaisesRegex(dc.CheckError, r"panel 'Collective' query A: 2 series, none with a finite value"):
            dc.check_dashboard_data(fake.url, [self.board], [self.rules], wait=0)

    def test_an_empty_panel_and_an_empty_recording_rule_fail(self):
        def no_errors(query):
            return vector() if "code" in query or query.startswith("sum(rate") else self.healthy(query)

        fake = self.serve(no_errors)
        with self.assertRaises(dc.CheckError) as cm:
            dc.check_dashboard_data(fake.url, [self.board], [self.rules], wait=0)
        self.assertIn("panel 'Errors' query A: no series", str(cm.exception))
        self.assertIn("recording rule cell:x:ratio: no series", str(cm.exception))
        self.assertNotIn("Collective", str(cm.exception))

    def test_a_variable_whose_label_is_missing_fails(self):
        def unlabelled(query):
            if query.startswith("orthoserve_build_info"):
                return vector(({"__name__": "orthoserve_build_info"}, "1"))  # Scraped without `cell`.
            return self.healthy(query)

        fake = self.serve(unlabelled)
        with self.assertRaisesRegex(dc.CheckError, "variable cell .label cell.: no series carrying label cell"):
            dc.check_dashboard_data(fake.url, [self.board], [self.rules], wait=0)

    def test_data_arriving_later_passes_within_the_wait(self):
        calls = {"n": 0}

        def late(query):
            calls["n"] += 1
            return vector() if calls["n"] <= 4 else self.healthy(query)

        fake = self.serve(late)
        dc.check_dashboard_data(fake.url, [self.board], [self.rules], wait=5)

    def test_a_query_prometheus_rejects_fails(self):
        fake = self.serve(lambda q: (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}))
        with self.assertRaisesRegex(dc.CheckError, "bad_data: parse error"):
            dc.check_dashboard_data(fake.url, [self.board], [], wait=0)

    def test_the_real_dashboard_queries_are_all_checked(self):
        fake = self.serve(self.healthy)
        board = ROOT / "deploy/grafana/orthoserve.json"
        dc.check_dashboard_data(fake.url, [str(board)], [str(ROOT / "deploy/prometheus/orthoserve-rules.yaml")],
                                wait=0)
        panel_queries = sum(1 for title, _ in dc.dashboard_exprs(board) if not title.startswith("variable "))
        variables = sum(1 for _ in dc.dashboard_variables(board))
        records = sum(1 for name, _ in dc.rules_exprs(ROOT / "deploy/prometheus/orthoserve-rules.yaml")[0]
                      if ":" in name)
        self.assertEqual(len(fake.queries), panel_queries + variables + records)
        self.assertFalse([q for q in fake.queries if "$" in q], "a Grafana variable reached Prometheus")

    def test_targets_wait_counts_scraped_targets(self):
        up = {"n": 0}

        def scraping(query):
            up["n"] += 1
            self.assertEqual(query, 'up{job="orthoserve-fleet"} == 1')
            return vector(*[({"pod": f"orthoserve-{i}"}, "1") for i in range(min(up["n"], 2))])

        fake = self.serve(scraping)
        dc.wait_prometheus_targets(fake.url, 'job="orthoserve-fleet"', 2, wait=5)
        with self.assertRaisesRegex(dc.CheckError, "2 of 3 targets up"):
            dc.wait_prometheus_targets(fake.url, 'job="orthoserve-fleet"', 3, wait=0)


class RuleTestsCoverageTest(unittest.TestCase):
    def test_every_alert_has_a_promtool_test_in_which_it_fires(self):
        exprs, recorded = dc.rules_exprs(ROOT / "deploy/prometheus/orthoserve-rules.yaml")
        alerts = {name for name, _ in exprs if name not in recorded}
        tests = yaml.safe_load((ROOT / "deploy/prometheus/orthoserve-rules.test.yaml").read_text())["tests"]
        firing = {t["alertname"] for group in tests for t in group.get("alert_rule_test", []) if t.get("exp_alerts")}
        self.assertEqual(sorted(alerts - firing), [], "alerts without a promtool test in which they fire")
        self.assertEqual(sorted(firing - alerts), [], "tests of alerts that no longer exist")


class PrometheusRuleTest(TempDir):
    def test_in_step_and_drift_detected(self):
        rules = ROOT / "deploy/prometheus/orthoserve-rules.yaml"
        generated = ROOT / "deploy/k8s/examples/monitoring/prometheusrule.yaml"
        dc.check_prometheusrule(str(rules), str(generated), write=False)
        drifted = self.write("rules.yaml", rules.read_text().replace("> 0.05", "> 0.5"))
        with self.assertRaisesRegex(dc.CheckError, "is not the PrometheusRule form"):
            dc.check_prometheusrule(drifted, str(generated), write=False)


if __name__ == "__main__":
    unittest.main(buffer=True)
