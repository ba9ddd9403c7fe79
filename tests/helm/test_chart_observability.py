"""The chart's observability, rendered offline: the Grafana dashboard and the PrometheusRule
(structure, PromQL that parses, and names only series the processes export: collected from
their real registries here, from a real ``tandem local`` in tests/integration/test_metrics.py),
the scrape key that lets the ServiceMonitor read the router's /metrics with API keys on, and
the Ray-mode workers' metrics (flag, Services, monitors, NetworkPolicy)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import promql_parser
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from tandem.engine.outputs import EngineStats
from tandem.placement.slo import ITL_BUCKETS, TTFT_BUCKETS
from tandem.router.admission import AdmissionLedger
from tandem.router.cli import build_parser as router_parser
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.membership.registry import Registry
from tandem.router.metrics import RouterMetrics
from tandem.worker.metrics import TransferTotals, WorkerMetrics
from tandem.worker.prefill.metrics import PrefillMetrics
from tests.helm.chart import (
    CHART,
    EXAMPLES,
    VALUES,
    by_kind,
    load_values,
    objects,
    pod_specs,
    processes,
    render,
    validate,
)
from tests.helm.chart import keyless as chart_keyless
from tests.helm.test_chart_security import PROMETHEUS, _network, _reaches
from tests.promql import dashboard_queries, metric_names, rule_queries

DASHBOARD = CHART / "files" / "grafana" / "tandem.json"
DEPLOYMENTS_KEYED = VALUES / "deployments-hpa.yaml"  # API keys, TLS, a ServiceMonitor
RAY_KEYED = EXAMPLES / "gpu-multinode-autoscale.yaml"  # the same in ray mode

# PrometheusRule's spec as the Prometheus operator's CRD defines it (monitoring.coreos.com/v1,
# the fields the chart may use), strict about unknown fields.
_DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?" \
            "(([0-9]+)ms)?)$"
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "required": ["groups"], "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": {"type": "string", "pattern": _DURATION},
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]*$"},
                            "record": {"type": "string"},
                            "expr": {"type": "string", "minLength": 1},
                            "for": {"type": "string", "pattern": _DURATION},
                            "keep_firing_for": {"type": "string", "pattern": _DURATION},
                            "labels": _STRINGS,
                            "annotations": _STRINGS,
                        }}},
                }}}},
        },
    },
}


def exported_sample_names() -> set[str]:
    """Every sample name the router's and both workers' /metrics carry, from their real
    registries after one of each thing they count (a family with no sample is not a name)."""
    counters = HandoffCounters()
    counters.decisions[("remote", "placed")] = 1
    router = RouterMetrics(counters, AdmissionLedger(4, 8, 100), Registry(time.monotonic, 1.0),
                           model_name="m")
    stats = EngineStats(num_running=0, num_waiting=0, num_waiting_for_remote_kv=0, num_held=0,
                        num_blocks=8, num_free_blocks=8, kv_cache_usage=0.0,
                        prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0,
                        num_steps=0, num_generated_tokens=0)
    workers = [WorkerMetrics("decode", model_name="m"), PrefillMetrics(model_name="m")]
    for w in workers:
        w.update(stats, TransferTotals())
    names: set[str] = set()
    for metrics in (router, *workers):
        text = generate_latest(metrics.registry).decode()
        names |= {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    return names


def _rendered(case: Path, **metrics: Any) -> list[dict[str, Any]]:
    values = load_values(case)
    values["metrics"] = {**values.get("metrics", {}), **metrics}
    return objects(render(values))


def _only(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, (kind, len(found))
    return found[0]


def _check_names(queries: list[tuple[str, str]], exported: set[str]) -> None:
    assert queries
    for where, expr in queries:
        names = metric_names(expr)
        assert names, where
        assert names <= exported, (where, sorted(names - exported))


def test_the_dashboard_and_the_rules_are_off_by_default() -> None:
    objs = objects(render(load_values(DEPLOYMENTS_KEYED)))
    assert not by_kind(objs, "PrometheusRule")
    assert not [o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


@pytest.mark.parametrize("case", [DEPLOYMENTS_KEYED, RAY_KEYED], ids=["deployments", "ray"])
def test_dashboard_configmap_holds_a_dashboard_of_exported_series(case: Path) -> None:
    objs = _rendered(case, grafanaDashboard={"enabled": True,
                                             "annotations": {"grafana_folder": "Tandem"}})
    cm = next(o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard"))
    validate(cm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Tandem"}
    dashboard = json.loads(cm["data"]["tandem.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())  # the file, as it is
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15 and len({p["id"] for p in dashboard["panels"]}) == len(
        dashboard["panels"])
    for p in panels:
        assert p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
    _check_names(list(dashboard_queries(dashboard)), exported_sample_names())


@pytest.mark.parametrize("case", [DEPLOYMENTS_KEYED, RAY_KEYED], ids=["deployments", "ray"])
def test_prometheus_rule_is_well_formed_and_names_exported_series(case: Path) -> None:
    objs = _rendered(case, prometheusRule={"enabled": True, "labels": {"release": "kps"}})
    rule = _only(objs, "PrometheusRule")
    jsonschema.validate(rule, RULE_SCHEMA)
    assert rule["metadata"]["labels"]["release"] == "kps"
    groups = rule["spec"]["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    for g in groups:
        for r in g["rules"]:
            promql_parser.parse_duration(r["for"])
            assert r["labels"]["severity"] in ("critical", "warning")
            assert r["annotations"]["summary"] and r["annotations"]["description"]
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    assert alerts == {"TandemTTFTSLOBurn", "TandemTPOTSLOBurn", "TandemKVCacheUsageHigh",
                      "TandemKVTransferFailures", "TandemKVBlocksStranded",
                      "TandemKVLeasesStuck", "TandemNoDecodeWorker", "TandemRouterMetricsAbsent"}
    _check_names(list(rule_queries(rule)), exported_sample_names())


def test_slo_rules_count_inside_a_real_bucket_of_the_threshold_given() -> None:
    """The burn rate counts requests in the bucket ``le`` = the SLO threshold, so the
    threshold must be a bucket bound written as the le label is (the schema's enum)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    slo = schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["slo"]
    assert slo["properties"]["ttftSeconds"]["enum"] == [floatToGoString(b) for b in TTFT_BUCKETS]
    assert slo["properties"]["tpotSeconds"]["enum"] == [floatToGoString(b) for b in ITL_BUCKETS]
    rule = _only(_rendered(DEPLOYMENTS_KEYED, prometheusRule={
        "enabled": True, "slo": {"objective": 0.995, "ttftSeconds": "0.5",
                                 "tpotSeconds": "0.05"}}), "PrometheusRule")
    exprs = {r["alert"] + r["labels"].get("window", ""): r["expr"]
             for g in rule["spec"]["groups"] for r in g["rules"]}
    assert 'le="0.5"' in exprs["TandemTTFTSLOBurn1h"] and 'le="0.05"' in exprs["TandemTPOTSLOBurn6h"]
    assert "> 0.072" in exprs["TandemTTFTSLOBurn1h"]  # 14.4 x (1 - 0.995)
    assert "> 0.03" in exprs["TandemTPOTSLOBurn6h"]  # 6 x (1 - 0.995)
    for bad in ({"ttftSeconds": "2"}, {"tpotSeconds": "0.07"}, {"objective": 1}):
        values = load_values(DEPLOYMENTS_KEYED)
        values["metrics"]["prometheusRule"] = {"enabled": True, "slo": bad}
        with pytest.raises(Exception, match="ttftSeconds|tpotSeconds|objective"):
            render(values)


@pytest.mark.parametrize("case", [DEPLOYMENTS_KEYED, RAY_KEYED], ids=["deployments", "ray"])
def test_with_api_keys_the_router_monitor_presents_the_scrape_key(case: Path) -> None:
    """The ServiceMonitor's bearer is a Secret the release has, mounted in the router's pod
    at the file its --metrics-key-file names."""
    objs = objects(render(load_values(case)))
    monitor = next(o for o in by_kind(objs, "ServiceMonitor")
                   if o["metadata"]["name"].endswith("-router"))
    auth = monitor["spec"]["endpoints"][0]["authorization"]
    secret_name, key = auth["credentials"]["name"], auth["credentials"]["key"]
    assert auth["type"] == "Bearer" and key == "metrics-key"
    secret = next(o for o in by_kind(objs, "Secret") if o["metadata"]["name"] == secret_name)
    assert key in secret["data"]
    router = next(p for p in processes(objs) if p.component == "router")
    argv = router.argv
    if router.command == "up":
        from tandem.launcher.up import build_parser
        argv = ["--tokenizer", "t", *build_parser().parse_args(router.argv).router_arg]
    path = Path(router_parser().parse_args(argv).metrics_key_file)
    volume = next(v for v in router.spec["volumes"] if v.get("secret", {}).get("secretName")
                  == secret_name)
    mount = next(m for m in router.spec["containers"][0]["volumeMounts"]
                 if m["name"] == volume["name"])
    assert path.parent == Path(mount["mountPath"])
    assert {"key": key, "path": path.name} in volume["secret"]["items"]


def test_an_existing_scrape_key_is_used_and_none_generated() -> None:
    values = load_values(DEPLOYMENTS_KEYED)
    values["metrics"]["scrapeKey"] = {"existingSecret": "my-scrape-key"}
    objs = objects(render(values))
    assert not [o for o in by_kind(objs, "Secret") if o["metadata"]["name"].endswith("-metrics-key")]
    monitor = next(o for o in by_kind(objs, "ServiceMonitor")
                   if o["metadata"]["name"].endswith("-router"))
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == "my-scrape-key"
    keyless = objects(render(chart_keyless(EXAMPLES / "gpu-deployments-keda.yaml")))
    monitor = next(o for o in by_kind(keyless, "ServiceMonitor")
                   if o["metadata"]["name"].endswith("-router"))
    assert "authorization" not in monitor["spec"]["endpoints"][0]  # /metrics is open then
    assert not [o for o in by_kind(keyless, "Secret") if o["metadata"]["name"].endswith("-metrics-key")]


def test_ray_workers_serve_metrics_that_services_monitors_and_policies_reach() -> None:
    objs = objects(render(load_values(RAY_KEYED)))
    up = next(p for p in processes(objs) if p.command == "up")
    from tandem.launcher.up import build_parser
    port = build_parser().parse_args(up.argv).worker_metrics_port
    assert port == load_values(RAY_KEYED).get("decode", {}).get("metricsPort", 9090) > 0
    services = {o["metadata"]["name"]: o for o in by_kind(objs, "Service")}
    monitors = {o["metadata"]["name"] for o in by_kind(objs, "ServiceMonitor")}
    policies, pods = _network(RAY_KEYED)
    for role in ("prefill", "decode"):
        svc = services[f"tandem-{role}"]
        validate(svc)
        assert svc["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": port,
                                         "protocol": "TCP"}]
        ray_pods = [meta["labels"] for o in by_kind(objs, "RayCluster")
                    for c, meta, _ in pod_specs(o) if c == role]
        assert ray_pods and all(
            all(meta.get(k) == v for k, v in svc["spec"]["selector"].items()) for meta in ray_pods)
        assert f"tandem-{role}" in monitors
        assert _reaches(policies, PROMETHEUS, pods[role], port)
    values = load_values(RAY_KEYED)
    values.setdefault("prefill", {})["metricsPort"] = 9191
    with pytest.raises(Exception, match="metricsPort"):
        render(values)


def test_rule_and_dashboard_files_are_what_the_docs_list() -> None:
    """docs/metrics.md names every alert and the dashboard file."""
    doc = (CHART.parents[2] / "docs" / "metrics.md").read_text()
    rule = _only(_rendered(DEPLOYMENTS_KEYED, prometheusRule={"enabled": True}), "PrometheusRule")
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            assert r["alert"] in doc, r["alert"]
    assert "files/grafana/tandem.json" in doc
