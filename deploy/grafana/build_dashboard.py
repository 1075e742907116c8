#!/usr/bin/env python3
"""Writes the orthoserve Grafana dashboard (orthoserve.json) from the panel list below.

Run `python3 deploy/grafana/build_dashboard.py` after editing; scripts/check_deploy.sh fails when
orthoserve.json is not what this script produces. Standard library only.
"""
import json
import pathlib
import sys

SEL = 'namespace=~"$namespace", cell=~"$cell"'
RI = "$__rate_interval"


def target(expr, legend, ref):
    return {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr,
            "legendFormat": legend, "refId": ref}


def timeseries(title, exprs, unit, x, y, w=12, h=8, description="", stack=False):
    return {
        "type": "timeseries", "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"}}}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(exprs)],
    }


def stat(title, expr, legend, unit, x, y, w=4, h=4, description="", mappings=None, thresholds=None):
    return {
        "type": "stat", "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {
            "unit": unit, "mappings": mappings or [],
            "thresholds": thresholds or {"mode": "absolute", "steps": [{"color": "green", "value": None}]}},
            "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "none", "textMode": "auto"},
        "targets": [target(expr, legend, "A")],
    }


def stats(title, exprs, unit, x, y, w=8, h=4, description=""):
    """A stat panel with one value per query (each a series per cell)."""
    panel = stat(title, exprs[0][0], exprs[0][1], unit, x, y, w=w, h=h, description=description)
    panel["targets"] = [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(exprs)]
    panel["options"]["colorMode"] = "none"
    return panel


def row(title, y):
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            "panels": []}


def quantiles(metric, by, legend_prefix):
    return [(f'histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{SEL}}}[{RI}])))',
             f"{legend_prefix} p{int(q * 100)}") for q in (0.5, 0.9, 0.99)]


def panels():
    out = []
    y = 0
    out.append(row("Fleet", y)); y += 1
    red_green = {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]}
    out.append(stat("Group steps", f'max by (cell) (orthoserve_fleet_ready{{{SEL}}})', "{{cell}}", "none", 0, y,
                    description="UP while a fleet generation has formed (some rank of the cell is a member of it), "
                                "so group steps are served. DOWN: no rank is a member, usually because rank 0, the "
                                "coordinator, is away; every rank still serves lone clients alone.",
                    mappings=[{"type": "value", "options": {"0": {"text": "DOWN"}, "1": {"text": "UP"}}}],
                    thresholds=red_green))
    out.append(stat("Fleet members", f'max by (cell) (orthoserve_fleet_members_ready{{{SEL}}})', "{{cell}} members",
                    "none", 4, y, description="Members of the fleet's current generation."))
    out.append(stat("Fleet size", f'max by (cell) (orthoserve_fleet_size{{{SEL}}})', "{{cell}}", "none", 8, y,
                    description="ORTHOSERVE_WORLD: the ranks the fleet runs with when none is missing."))
    out.append(stat("Requests/s", f'sum(rate(orthoserve_requests_total{{{SEL}}}[{RI}]))', "", "reqps", 12, y))
    out.append(stat("NS FLOP/s", f'sum(rate(orthoserve_newton_schulz_flops_total{{{SEL}}}[{RI}]))', "", "flops", 16, y))
    out.append(stat("Build", f'count by (version, backend, device) (orthoserve_build_info{{{SEL}}})',
                    "{{version}} {{backend}} {{device}}", "none", 20, y))
    y += 4
    out.append(timeseries("Rendezvous timeouts and aborted steps", [
        (f'sum by (cell) (increase(orthoserve_rendezvous_timeouts_total{{{SEL}}}[{RI}]))', "{{cell}} rendezvous timeouts"),
        (f'sum by (cell, reason) (increase(orthoserve_steps_aborted_total{{{SEL}}}[{RI}]))',
         "{{cell}} aborted: {{reason}}")], "none", 0, y, w=24,
        description="Counted on the ranks whose trainers waited for the step. timeout: not every trainer rank "
                    "arrived within the rendezvous timeout; cancelled: a trainer rank's client cancelled or ran out "
                    "of time; aborted: a trainer rank's call failed otherwise; invalid: the trainer ranks disagree; "
                    "collective: the batch failed in the fleet's collective; fleet_change: planned for a generation "
                    "that ended (the last two are retried by the clients)."))
    y += 8

    out.append(row("Fleet membership", y)); y += 1
    out.append(timeseries("Generation", [
        (f'max by (cell) (orthoserve_fleet_generation{{{SEL}}})', "{{cell}}")], "none", 0, y, w=8,
        description="The fleet's membership generation: one step up per re-formation (a rank joined, left, restarted "
                    "or was lost). It starts again at 1 when rank 0, the coordinator, restarts."))
    out.append(timeseries("Members vs size", [
        (f'max by (cell) (orthoserve_fleet_members_ready{{{SEL}}})', "{{cell}} members"),
        (f'max by (cell) (orthoserve_fleet_size{{{SEL}}})', "{{cell}} size"),
        (f'sum by (cell) (orthoserve_fleet_ready{{{SEL}}})', "{{cell}} ranks in a formed generation")], "none", 8, y,
        w=8, description="Members below size: the fleet runs without a rank (missing, restarting, draining or lost). "
                         "Ranks outside the fleet serve lone clients alone."))
    out.append(timeseries("Re-formations by reason", [
        (f'sum by (cell, reason) (increase(orthoserve_fleet_reformations_total{{{SEL}}}[{RI}]))',
         "{{cell}} {{reason}}")],
        "none", 16, y, w=8, stack=True,
        description="Generations started by the coordinator (counted on rank 0): joined, left (planned: rollouts, "
                    "drains), restarted, lost, collective_failed (unplanned)."))
    y += 8
    out.append(timeseries("Retried steps/s", [
        (f'sum by (cell, method) (rate(orthoserve_steps_retried_total{{{SEL}}}[{RI}]))', "{{cell}} {{method}}")],
        "ops", 0, y, w=8,
        description="Steps a client sent again after a retryable failure (StepHeader.attempt > 0), counted where "
                    "the retry lands."))
    out.append(timeseries("Share of steps retried", [
        (f'sum by (cell, method) (rate(orthoserve_steps_retried_total{{{SEL}}}[{RI}])) / sum by (cell, method) '
         f'(rate(orthoserve_requests_total{{{SEL}, method=~"Orthogonalize|OrthogonalizeStream"}}[{RI}]))',
         "{{cell}} {{method}}")], "percentunit", 8, y, w=8))
    out.append(timeseries("Time degraded", [
        (f'sum by (pod) (rate(orthoserve_fleet_degraded_seconds_total{{{SEL}}}[{RI}]))', "{{pod}}")],
        "percentunit", 16, y, w=8,
        description="Share of time each rank saw fewer fleet members than ORTHOSERVE_WORLD, or was outside the "
                    "fleet itself (orthoserve_fleet_degraded_seconds_total)."))
    y += 8

    out.append(row("Traffic", y)); y += 1
    out.append(timeseries("Requests by method", [
        (f'sum by (method) (rate(orthoserve_requests_total{{{SEL}}}[{RI}]))', "{{method}}")], "reqps", 0, y))
    out.append(timeseries("Errors by code", [
        (f'sum by (method, code) (rate(orthoserve_requests_total{{{SEL}, code!="OK"}}[{RI}]))', "{{method}} {{code}}"),
        (f'sum by (algorithm, code) (rate(orthoserve_matrices_total{{{SEL}, code!="OK"}}[{RI}]))',
         "matrices {{algorithm}} {{code}}")], "reqps", 12, y, stack=True,
        description="Requests and matrices that did not end OK, by gRPC code."))
    y += 8
    out.append(timeseries("Matrices/s by algorithm and dtype", [
        (f'sum by (algorithm, dtype) (rate(orthoserve_matrices_total{{{SEL}}}[{RI}]))', "{{algorithm}} {{dtype}}")],
        "ops", 0, y))
    out.append(timeseries("Bytes in and out", [
        (f'sum by (method) (rate(orthoserve_received_bytes_total{{{SEL}}}[{RI}]))', "in {{method}}"),
        (f'-sum by (method) (rate(orthoserve_sent_bytes_total{{{SEL}}}[{RI}]))', "out {{method}}")], "Bps", 12, y,
        description="Received above the axis, sent below."))
    y += 8
    out.append(timeseries("NS FLOP/s by rank", [
        (f'sum by (pod) (rate(orthoserve_newton_schulz_flops_total{{{SEL}}}[{RI}]))', "{{pod}}")], "flops", 0, y))
    out.append(timeseries("Request latency", quantiles("orthoserve_request_duration_seconds", "method", "{{method}}"),
                          "s", 12, y))
    y += 8

    out.append(row("Stages", y)); y += 1
    out.append(timeseries("Stage latency p50", [
        (f'histogram_quantile(0.5, sum by (stage, le) (rate(orthoserve_stage_duration_seconds_bucket{{{SEL}}}[{RI}])))',
         "{{stage}}")], "s", 0, y, w=8, description="receive, queue, rendezvous, collective, compute, send"))
    out.append(timeseries("Stage latency p90", [
        (f'histogram_quantile(0.9, sum by (stage, le) (rate(orthoserve_stage_duration_seconds_bucket{{{SEL}}}[{RI}])))',
         "{{stage}}")], "s", 8, y, w=8))
    out.append(timeseries("Stage latency p99", [
        (f'histogram_quantile(0.99, sum by (stage, le) (rate(orthoserve_stage_duration_seconds_bucket{{{SEL}}}[{RI}])))',
         "{{stage}}")], "s", 16, y, w=8))
    y += 8
    out.append(timeseries("Mean time per stage", [
        (f'sum by (stage) (rate(orthoserve_stage_duration_seconds_sum{{{SEL}}}[{RI}])) / '
         f'sum by (stage) (rate(orthoserve_stage_duration_seconds_count{{{SEL}}}[{RI}]))', "{{stage}}")],
        "s", 0, y, stack=True))
    out.append(timeseries("Collective duration by op", quantiles("orthoserve_collective_duration_seconds", "op", "{{op}}"),
                          "s", 12, y,
                          description="Each call of the fleet's collective (Gloo, NCCL, or local on a one-rank fleet) "
                                      "that group steps and lone clients on a formed fleet make, failed calls "
                                      "included."))
    y += 8

    out.append(row("Load and memory", y)); y += 1
    out.append(timeseries("Queue depth", [
        (f'sum by (pod) (orthoserve_queue_depth{{{SEL}}})', "{{pod}}")], "none", 0, y, w=8))
    out.append(timeseries("In-flight requests", [
        (f'sum by (pod) (orthoserve_inflight_requests{{{SEL}}})', "{{pod}} requests"),
        (f'sum by (pod) (orthoserve_inflight_streams{{{SEL}}})', "{{pod}} streams")], "none", 8, y, w=8,
        description="RPCs in progress, and the OrthogonalizeStream calls among them (admitted against "
                    "--max-concurrent-streams)."))
    out.append(timeseries("In-flight bytes", [
        (f'sum by (pod) (orthoserve_inflight_bytes{{{SEL}}})', "{{pod}}"),
        (f'max by (pod) (orthoserve_limit_inflight_bytes{{{SEL}}})', "{{pod}} limit")], "bytes", 16, y, w=8,
        description="Matrix bytes held for requests in progress, and --max-inflight-bytes."))
    y += 8
    out.append(timeseries("Use of the limits", [
        (f'max by (pod) (orthoserve_inflight_bytes{{{SEL}}} / orthoserve_limit_inflight_bytes{{{SEL}}})',
         "{{pod}} in-flight bytes"),
        (f'max by (pod, tenant) (orthoserve_tenant_inflight_bytes{{{SEL}}} / ignoring (tenant) group_left '
         f'orthoserve_limit_tenant_inflight_bytes{{{SEL}}})', "{{pod}} tenant {{tenant}}"),
        (f'max by (pod) (orthoserve_inflight_streams{{{SEL}}} / orthoserve_limit_concurrent_streams{{{SEL}}})',
         "{{pod}} streams")], "percentunit", 0, y, w=12,
        description="Use as a share of --max-inflight-bytes, --max-tenant-inflight-bytes (per tenant) and "
                    "--max-concurrent-streams. Requests beyond a limit get RESOURCE_EXHAUSTED; the *NearLimit "
                    "alerts fire above 90% for 10 minutes."))
    out.append(timeseries("Device memory", [
        (f'sum by (pod, kind) (orthoserve_device_memory_bytes{{{SEL}}})', "{{pod}} {{kind}}")], "bytes", 12, y, w=12,
        description="used: device memory tasks hold now (0 on the cpu backend); budget: what the backend may hold."))
    y += 8
    limit = "max by (cell) (orthoserve_limit_{}{{" + SEL + "}})"
    out.append(stats("Limits: bytes", [
        (limit.format("inflight_bytes"), "{{cell}} in flight"),
        (limit.format("tenant_inflight_bytes"), "{{cell}} per tenant"),
        (limit.format("message_bytes"), "{{cell}} message"),
        (limit.format("chunk_bytes"), "{{cell}} chunk")], "bytes", 0, y,
        description="--max-inflight-bytes, --max-tenant-inflight-bytes, --max-message-bytes, --chunk-bytes "
                    "(orthoserve_limit_* gauges)."))
    out.append(stats("Limits: counts", [
        (limit.format("concurrent_streams"), "{{cell}} streams"),
        (limit.format("matrix_elements"), "{{cell}} matrix elements"),
        (limit.format("matrices_per_step"), "{{cell}} matrices per step"),
        (limit.format("compute_workers"), "{{cell}} compute workers")], "short", 8, y,
        description="--max-concurrent-streams, --max-matrix-elements, --max-matrices-per-step, --workers."))
    out.append(stats("Limits: timeouts", [
        (limit.format("rendezvous_timeout_seconds"), "{{cell}} rendezvous"),
        (limit.format("collective_timeout_seconds"), "{{cell}} collective")], "s", 16, y,
        description="--rendezvous-timeout, --collective-timeout."))
    y += 4

    out.append(row("Tenants", y)); y += 1
    out.append(timeseries("Compute-queue wait by tenant", quantiles(
        "orthoserve_tenant_queue_wait_seconds", "tenant", "{{tenant}}"), "s", 0, y, w=8,
        description="How long lone clients' matrices waited for a compute worker, by tenant (--tenant-labels: "
                    "\"all\" unless names or hashes are enabled). The compute queue is weighted fair between "
                    "tenants (--tenant-shares); OrthoserveTenantStarved fires when a tenant's p99 stays high."))
    out.append(timeseries("Compute by tenant", [
        (f'sum by (tenant) (rate(orthoserve_tenant_compute_seconds_total{{{SEL}}}[{RI}]))', "{{tenant}}")],
        "short", 8, y, w=8, description="Compute seconds per second (workers busy) spent on each tenant's lone "
                                        "matrices."))
    out.append(timeseries("Bytes and refusals by tenant", [
        (f'sum by (tenant, direction) (rate(orthoserve_tenant_bytes_total{{{SEL}}}[{RI}]))',
         "{{tenant}} {{direction}} B/s"),
        (f'sum by (tenant, limit) (rate(orthoserve_tenant_refusals_total{{{SEL}}}[{RI}]))',
         "{{tenant}} refused: {{limit}} /s"),
        (f'sum by (tenant, cause) (rate(orthoserve_tenant_cuts_total{{{SEL}}}[{RI}]))',
         "{{tenant}} cut: {{cause}} /s")], "short", 16, y, w=8,
        description="Matrix bytes received and sent per second, RESOURCE_EXHAUSTED refusals per second by "
                    "the limit that refused them, and calls the server cut per second by cause (a client that "
                    "stopped sending or reading, a unary request that never came, a waiter pushed out)."))
    y += 8

    out.append(row("Process", y)); y += 1
    out.append(timeseries("CPU", [
        (f'sum by (pod) (rate(process_cpu_seconds_total{{{SEL}}}[{RI}]))', "{{pod}}")], "short", 0, y, w=6,
        description="CPU seconds per second (cores busy), user and system."))
    out.append(timeseries("Resident memory", [
        (f'sum by (pod) (process_resident_memory_bytes{{{SEL}}})', "{{pod}}")], "bytes", 6, y, w=6))
    out.append(timeseries("Open file descriptors", [
        (f'max by (pod) (process_open_fds{{{SEL}}} / process_max_fds{{{SEL}}})', "{{pod}}")], "percentunit", 12,
        y, w=6, description="Open file descriptors as a share of the process's limit (sockets: clients, fleet "
                            "peers, Gloo pairs)."))
    out.append(timeseries("Threads and uptime", [
        (f'sum by (pod) (process_threads{{{SEL}}})', "{{pod}} threads"),
        (f'time() - max by (pod) (process_start_time_seconds{{{SEL}}})', "{{pod}} uptime (s)")], "short", 18, y,
        w=6, description="OS threads of the rank, and seconds since it started (a drop is a restart)."))
    return out


def variable(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "includeAll": True,
            "multi": True, "allValue": ".*", "current": {}, "sort": 1}


def dashboard():
    return {
        "uid": "orthoserve", "title": "orthoserve", "tags": ["orthoserve"], "editable": True,
        "schemaVersion": 39, "version": 1, "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"}, "timezone": "",
        "description": "orthoserve fleets: membership and re-formations, retries, traffic, errors by code, "
                       "latency by stage, collectives, load and use of the limits, process resources.",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            variable("namespace", "Namespace", "label_values(orthoserve_build_info, namespace)"),
            variable("cell", "Cell", 'label_values(orthoserve_build_info{namespace=~"$namespace"}, cell)'),
        ]},
        "annotations": {"list": []},
        "panels": [dict(p, id=i + 1) for i, p in enumerate(panels())],
    }


def render():
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    path = pathlib.Path(__file__).with_name("orthoserve.json")
    if sys.argv[1:] == ["--check"]:
        if path.read_text() != render():
            sys.exit(f"{path} is out of date: run python3 {__file__}")
    else:
        path.write_text(render())
