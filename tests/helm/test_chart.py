"""The Helm chart, rendered offline: golden files, valid objects, bad values refused.

Regenerate the golden files after an intended chart change (then review the diff):

    TANDEM_UPDATE_GOLDEN=1 .venv/bin/pytest tests/helm -q
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from tests.helm.chart import (
    CASES,
    CHART,
    EXAMPLES,
    GOLDEN,
    RELEASE,
    VALUES,
    by_kind,
    golden_text,
    launched,
    load_values,
    objects,
    pod_specs,
    render,
    render_file,
    validate,
)
from tests.unit.router.kube_api import selector_matches

UPDATE = os.environ.get("TANDEM_UPDATE_GOLDEN") == "1"


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {"cpu-quickstart.yaml", "gpu-single-node.yaml", "gpu-multinode-autoscale.yaml"} <= names


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_render_matches_golden(case: Path) -> None:
    text = golden_text(render_file(case))
    golden = GOLDEN / f"{case.stem}.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden}: run with TANDEM_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"{case.name} renders differently from {golden.name}; if intended, regenerate with "
        "TANDEM_UPDATE_GOLDEN=1 and review the diff"
    )


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_rendered_object_is_valid(case: Path) -> None:
    objs = objects(render_file(case))
    assert objs
    for obj in objs:
        validate(obj)
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], key)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_pods_probe_grpc_health_and_drain_within_their_grace(case: Path) -> None:
    values = helm.Chart.load(CHART).merge_values(load_values(case))
    for obj in objects(render_file(case)):
        for component, _, spec in pod_specs(obj):
            role = values["router"] if component == "router" else values[component]
            grace = spec["terminationGracePeriodSeconds"]
            assert grace >= role["preStopSleepSeconds"] + role["drainTimeoutSeconds"]
            container = spec["containers"][0]
            pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
            assert pre_stop[-1] == f"sleep {role['preStopSleepSeconds']}"
            if obj["kind"] == "RayCluster" and component != "router":
                continue  # Ray worker pods host actors; KubeRay probes their raylet
            if component == "router":
                _assert_router_probes(container, role, https=values["tls"]["enabled"])
            else:
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if values["workerTls"]["enabled"]:  # the kubelet's gRPC probe has no TLS
                        assert container[probe]["httpGet"] == {
                            "path": "/metrics", "port": role["metricsPort"], "scheme": "HTTP"}
                    else:
                        assert container[probe]["grpc"] == {"port": role["port"]}
            startup = container["startupProbe"]
            assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def _assert_router_probes(container: dict[str, Any], router: dict[str, Any], https: bool) -> None:
    """Ready = /health (a request sent now is served: a prefill and decode path is ready);
    started and alive = /livez (the process serves, whatever its workers do)."""
    scheme = "HTTPS" if https else "HTTP"
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/health", "port": router["httpPort"], "scheme": scheme}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {
            "path": "/livez", "port": router["httpPort"], "scheme": scheme}


def test_validation_has_teeth() -> None:
    """A misspelt field fails, for a core kind and for a custom kind."""
    objs = objects(render_file(EXAMPLES / "gpu-deployments-keda.yaml"))
    deployment = copy.deepcopy(by_kind(objs, "Deployment")[0])
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    scaled = copy.deepcopy(by_kind(objs, "ScaledObject")[0])
    scaled["spec"]["maxReplicas"] = 3  # KEDA calls it maxReplicaCount
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    (cluster,) = by_kind(objects(render_file(EXAMPLES / "gpu-single-node.yaml")), "RayCluster")
    cluster = copy.deepcopy(cluster)
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate(cluster)


def test_ray_mode_builds_a_raycluster_with_gpu_worker_groups() -> None:
    objs = objects(render_file(EXAMPLES / "gpu-multinode-autoscale.yaml"))
    (cluster,) = by_kind(objs, "RayCluster")
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 300
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"prefill", "decode"}
    assert (groups["decode"]["minReplicas"], groups["decode"]["maxReplicas"]) == (2, 8)
    for group in groups.values():
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # one device a worker
        assert group["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert group["template"]["spec"]["nodeSelector"]
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    script = head["args"][0]
    assert "tandem up --address auto" in script
    assert "--autoscale /etc/tandem/autoscale/autoscale.yaml" in script
    assert "--api-key-file=/etc/tandem/api-keys/api-keys" in script
    (config,) = by_kind(objs, "ConfigMap")
    assert "decode:\n  max: 8\n  min: 2" in config["data"]["autoscale.yaml"]
    (service,) = [s for s in by_kind(objs, "Service") if s["spec"].get("clusterIP") != "None"]
    assert {p["port"] for p in service["spec"]["ports"]} == {50051, 8000}
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    assert by_kind(objs, "Deployment") == []


def test_ray_autoscale_file_is_one_tandem_up_accepts(tmp_path: Path) -> None:
    from tandem.autoscaler.config import load_config

    objs = objects(render_file(EXAMPLES / "gpu-multinode-autoscale.yaml"))
    (config,) = by_kind(objs, "ConfigMap")
    path = tmp_path / "autoscale.yaml"
    path.write_text(config["data"]["autoscale.yaml"])
    loaded = load_config(path)
    assert loaded.policy == "queue"
    assert (loaded.decode.min, loaded.decode.max) == (2, 8)


def test_accelerator_resource_name_comes_from_values(tmp_path: Path) -> None:
    values = load_values(EXAMPLES / "gpu-single-node.yaml")
    values["decode"]["accelerator"] = {"resourceName": "amd.com/gpu", "count": 1}
    (cluster,) = by_kind(objects(render(values)), "RayCluster")
    decode = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "decode"][0]
    resources = decode["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["amd.com/gpu"] == 1 and "nvidia.com/gpu" not in resources["limits"]
    assert decode["rayStartParams"]["num-gpus"] == "1"


def test_deployments_mode_discovers_workers_with_rbac() -> None:
    objs = objects(render_file(EXAMPLES / "gpu-deployments-keda.yaml"))
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
                   for d in by_kind(objs, "Deployment")}
    assert set(deployments) == {"router", "prefill", "decode"}
    router = deployments["router"]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert "--discovery=kubernetes" in args
    selector = next(a.split("=", 1)[1] for a in args if a.startswith("--k8s-selector="))
    for role in ("prefill", "decode"):
        labels = deployments[role]["spec"]["template"]["metadata"]["labels"]
        assert selector_matches(selector, {"metadata": {"labels": labels}}), (selector, labels)
        # Autoscaled: the Deployment leaves replicas to KEDA.
        assert "replicas" not in deployments[role]["spec"]
    assert not selector_matches(selector, {"metadata": {
        "labels": deployments["router"]["spec"]["template"]["metadata"]["labels"]}})
    (role_obj,) = by_kind(objs, "Role")
    assert role_obj["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = by_kind(objs, "RoleBinding")
    (account,) = by_kind(objs, "ServiceAccount")
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    assert router["serviceAccountName"] == account["metadata"]["name"]
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in by_kind(objs, "ScaledObject")}
    assert set(scaled) == {f"{RELEASE}-prefill", f"{RELEASE}-decode"}
    query = scaled[f"{RELEASE}-decode"]["spec"]["triggers"][0]["metadata"]["query"]
    assert query.startswith('sum(tandem_num_requests_running{role="decode"')


def test_hpa_variant_and_secrets_from_values() -> None:
    objs = objects(render_file(VALUES / "deployments-hpa.yaml"))
    hpas = by_kind(objs, "HorizontalPodAutoscaler")
    assert sorted(h["spec"]["maxReplicas"] for h in hpas) == [3, 5]
    assert by_kind(objs, "ScaledObject") == []
    secrets = {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}
    assert secrets[f"{RELEASE}-api-keys"]["stringData"]["api-keys"] == "key-one\nkey-two\n"
    assert secrets[f"{RELEASE}-tls"]["type"] == "kubernetes.io/tls"
    (ingress,) = by_kind(objs, "Ingress")
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"] == {
        "name": "http"}
    monitors = by_kind(objs, "ServiceMonitor")
    assert {m["spec"]["endpoints"][0]["port"] for m in monitors} == {"http", "metrics"}


def test_service_monitor_only_when_the_flag_says_so() -> None:
    values = load_values(EXAMPLES / "cpu-quickstart.yaml")
    assert by_kind(objects(render(values)), "ServiceMonitor") == []
    values["metrics"] = {"serviceMonitor": {"enabled": True}}
    assert len(by_kind(objects(render(values)), "ServiceMonitor")) == 3


def test_notes_say_how_to_call_the_service() -> None:
    notes = render_file(EXAMPLES / "cpu-quickstart.yaml")["tandem/templates/NOTES.txt"]
    assert "port-forward svc/tandem 50051:50051 8000:8000" in notes
    assert "/v1/chat/completions" in notes and '"model": "smollm2"' in notes
    assert "helm test tandem -n serving --logs" in notes


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("bad-negative-replicas", "/decode/replicas"),
        ("bad-unknown-mode", "/mode"),
        ("bad-missing-model", "/model/name"),
        ("bad-unknown-key", "prefil"),
        ("bad-insecure-with-existing-secret", "/clusterSecret/existingSecret"),
        ("bad-kv-tls-without-secret", "/kvTls/existingSecret"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(case: str, field: str) -> None:
    values = load_values(VALUES / f"{case}.yaml")
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert field in str(err.value)
    with pytest.raises(helm.HelmValuesError, match=re.escape(field)):
        helm.Chart.load(CHART).validate_schema(values)


def test_replicas_outside_min_max_fail_the_render() -> None:
    with pytest.raises(helm.HelmError, match=r"prefill: need minReplicas <= replicas"):
        render(load_values(VALUES / "bad-replicas-above-max.yaml"))


def test_chart_lints_clean() -> None:
    report = helm.lint(CHART, load_values(EXAMPLES / "cpu-quickstart.yaml"), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [] and report["errors"] == [], report


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_rendered_command_lines_parse_with_the_real_clis(case: Path) -> None:
    """Every flag the chart passes exists, in the process that receives it (in ray mode, what
    tandem up hands the router and each worker role); the engine flags make a valid config."""
    from tandem.engine.cli_args import engine_config_from_args

    procs = launched(objects(render_file(case)))
    assert sorted(p.role for p in procs) == ["decode", "prefill", "router"]
    for proc in procs:
        if proc.role != "router":
            engine_config_from_args(proc.args)  # raises on values the engine refuses
